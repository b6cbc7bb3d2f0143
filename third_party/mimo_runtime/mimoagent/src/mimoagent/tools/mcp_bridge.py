"""MCP tool bridge: list and call a task's MCP tools over stdio.

Upstream tunnels every MCP call through a one-shot bridge (``--list`` /
``--call <fn> --args-json ...``, one process per call, 120 s timeouts;
FACTS 2.2). We keep the one-shot shape: each list or call is a child
``python -m mimoagent.tools.mcp_bridge`` (the request as JSON on its stdin,
the reply as JSON on its stdout) that speaks stdio to the server with the
maintained ``mcp`` package: it starts the task's server script as its own
child (``python tools/<server>.py``), initializes a session, lists or
calls, and exits. The ``mcp`` package (pydantic, anyio) is imported only
there, never in the transport that stays resident for the whole episode
(its memory is the container's). State lives in the server's SQLite file,
so nothing is lost between calls. The server process runs with the
caller's privileges (root in the task container), which is what keeps the
state files out of the agent's reach.

A result is a plain dict: ``{"ok", "is_error", "content": [text...],
"structured", "error"}``. A server that cannot be started or does not
answer in time raises ``ToolServerDown`` -- an infrastructure failure, not
an agent mistake.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

DEFAULT_TIMEOUT = 120.0


class ToolServerDown(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    @classmethod
    def for_script(cls, name: str, script: str, *, env: dict | None = None,
                   python: str | None = None, cwd: str | None = None) -> "ServerSpec":
        return cls(name=name, command=python or sys.executable, args=(script,),
                   env=tuple(sorted((env or {}).items())), cwd=cwd)


def list_tools(server: ServerSpec, timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
    return _in_child(server, timeout, None, None)


def call_tool(server: ServerSpec, name: str, arguments: dict, timeout: float = DEFAULT_TIMEOUT) -> dict:
    return _in_child(server, timeout, name, arguments)


#: beyond the session's own timeout: the child's interpreter and imports
_CHILD_GRACE_S = 30.0


def _in_child(server: ServerSpec, timeout: float, name: str | None, arguments: dict | None) -> Any:
    request = json.dumps({"server": dataclasses.asdict(server), "timeout": timeout,
                          "name": name, "arguments": arguments})
    # The child imports this very package (an installed copy in containers,
    # the source tree under tests), whatever the caller's sys.path was.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": here}
    try:
        done = subprocess.run([sys.executable, "-m", "mimoagent.tools.mcp_bridge"], input=request,
                              capture_output=True, text=True, env=env,
                              timeout=timeout + _CHILD_GRACE_S)
    except subprocess.TimeoutExpired:
        raise ToolServerDown(f"MCP server {server.name!r}: the bridge gave no answer in "
                             f"{timeout + _CHILD_GRACE_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise ToolServerDown(f"MCP server {server.name!r}: the bridge exited {done.returncode} "
                             f"without a reply: {done.stderr[-500:]}") from None
    if "down" in reply:
        raise ToolServerDown(str(reply["down"]))
    return reply["result"]


def _child() -> int:
    request = json.loads(sys.stdin.read())
    raw = request["server"]
    server = ServerSpec(name=raw["name"], command=raw["command"], args=tuple(raw["args"]),
                        env=tuple(tuple(pair) for pair in raw["env"]), cwd=raw["cwd"])
    try:
        reply = {"result": _run(server, float(request["timeout"]), request["name"],
                                request["arguments"])}
    except ToolServerDown as exc:
        reply = {"down": str(exc)}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


def _run(server: ServerSpec, timeout: float, name: str | None, arguments: dict | None) -> Any:
    import anyio

    try:
        return anyio.run(_session, server, timeout, name, arguments)
    except ToolServerDown:
        raise
    except BaseException as exc:  # noqa: BLE001 -- exception groups from task groups
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise ToolServerDown(f"MCP server {server.name!r}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)
    if inner:
        return _describe(inner[0])
    return f"{type(exc).__name__}: {exc}"[:500]


async def _session(server: ServerSpec, timeout: float, name: str | None, arguments: dict | None):
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=server.command, args=list(server.args),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **dict(server.env)},
        cwd=server.cwd)
    with open(os.devnull, "w") as errlog:
        with anyio.fail_after(timeout):
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    if name is None:
                        listed = await session.list_tools()
                        return [{"name": t.name, "description": t.description or "",
                                 "input_schema": _schema(t)} for t in listed.tools]
                    result = await session.call_tool(name, arguments or {})
                    texts = [getattr(c, "text", None) or json.dumps(_dump(c)) for c in result.content]
                    return {"ok": not result.is_error, "is_error": bool(result.is_error),
                            "content": texts,
                            "structured": getattr(result, "structured_content", None),
                            "error": texts[0] if result.is_error and texts else None}


def _schema(tool: Any) -> dict:
    return getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}


def _dump(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else str(value)


if __name__ == "__main__":
    sys.exit(_child())
