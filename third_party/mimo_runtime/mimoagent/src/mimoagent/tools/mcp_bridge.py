"""MCP tool bridge: list and call a task's MCP tools over stdio.

Upstream tunnels every MCP call through a one-shot bridge (``--list`` /
``--call <fn> --args-json ...``, one process per call, 120 s timeouts;
FACTS 2.2). We keep the one-shot shape but speak stdio to the server
directly with the maintained ``mcp`` package: each call starts the task's
server script as a child (``python tools/<server>.py``), initializes a
session, lists or calls, and exits. State lives in the server's SQLite file,
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
    return _run(server, timeout, None, None)


def call_tool(server: ServerSpec, name: str, arguments: dict, timeout: float = DEFAULT_TIMEOUT) -> dict:
    return _run(server, timeout, name, arguments)


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
