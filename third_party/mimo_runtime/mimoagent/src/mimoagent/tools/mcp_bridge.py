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

An episode's own calls go through ``Sessions`` instead: one resident bridge
per server (``--resident``), started on the episode's first use of it, that
keeps its stdio session with one server process until the episode closes it
(before grading). A call is then a line each way, not two interpreters
importing ``mcp`` and a handshake (about two CPU seconds a call, which on a
busy host was enough to push an honest tool call past its deadline). What
decides the reward still meets a fresh server: grading lists every server
one-shot (``list_tools``). A resident bridge that misses a deadline or loses
its server is killed with its server (its own process group) and the call
raises ``ToolServerDown``, as the one-shot bridge would; the next call starts
a new one.

A result is a plain dict: ``{"ok", "is_error", "content": [text...],
"structured", "error"}``. A server that cannot be started or does not
answer in time raises ``ToolServerDown`` -- an infrastructure failure, not
an agent mistake.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
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


#: a resident bridge's reply line starts with this (anything else it prints is not one)
_REPLY = "\x1emcp-bridge "


class Resident:
    """One server's resident bridge: ``python -m mimoagent.tools.mcp_bridge
    --resident`` in a process group of its own, its server its child."""

    def __init__(self, server: ServerSpec) -> None:
        self.server = server
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mimoagent.tools.mcp_bridge", "--resident"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": here}, start_new_session=True)
        self._buffer = b""
        try:
            self._send({"server": dataclasses.asdict(server)})
        except OSError:
            self.close()
            raise

    def request(self, name: str | None, arguments: dict | None, timeout: float) -> Any:
        """The server's answer, or ``ToolServerDown`` (the bridge is then gone)."""
        try:
            self._send({"name": name, "arguments": arguments})
        except OSError:
            self.close()
            raise ToolServerDown(f"MCP server {self.server.name!r}: its bridge is gone") from None
        reply = self._reply(time.monotonic() + timeout + _CHILD_GRACE_S)
        if "down" in reply:
            self.close()
            raise ToolServerDown(str(reply["down"]))
        return reply["result"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Kill the bridge and every process under it (its server leads a
        session of its own); idempotent. No call is in flight when an
        episode closes its bridges, and a server keeps its state in its
        SQLite file, so nothing of the episode is lost."""
        if self.proc.poll() is None:
            for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
                for kill in (os.killpg, os.kill):  # its group, then it
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close() if pipe is not None else None
            except OSError:
                pass
        self.proc.wait()

    def _send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def _reply(self, deadline: float) -> dict:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                line, nl, rest = self._buffer.partition(b"\n")
                if nl:
                    self._buffer = rest
                    text = line.decode("utf-8", "replace")
                    if text.startswith(_REPLY):
                        return json.loads(text[len(_REPLY):])
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.close()
                    raise ToolServerDown(f"MCP server {self.server.name!r}: no answer by its "
                                         "deadline") from None
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.close()
                    raise ToolServerDown(f"MCP server {self.server.name!r}: its bridge exited "
                                         "without a reply") from None
                self._buffer += chunk


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from /proc's children lists)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


class Sessions:
    """An episode's resident bridges, one per server, started on first use."""

    def __init__(self) -> None:
        self._open: dict[ServerSpec, Resident] = {}
        self._lock = threading.Lock()

    def list_tools(self, server: ServerSpec, timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
        return self._request(server, None, None, timeout)

    def call_tool(self, server: ServerSpec, name: str, arguments: dict,
                  timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self._request(server, name, arguments, timeout)

    def close(self) -> None:
        with self._lock:
            bridges, self._open = list(self._open.values()), {}
        for bridge in bridges:
            bridge.close()

    def _request(self, server: ServerSpec, name: str | None, arguments: dict | None,
                 timeout: float) -> Any:
        with self._lock:
            bridge = self._open.get(server)
            if bridge is None or not bridge.alive():
                if bridge is not None:
                    bridge.close()
                try:
                    bridge = self._open[server] = Resident(server)
                except OSError as exc:  # no process to be had (a full pids table)
                    self._open.pop(server, None)
                    raise ToolServerDown(f"MCP server {server.name!r}: no bridge: {exc}") from None
            try:
                return bridge.request(name, arguments, timeout)
            except ToolServerDown:
                self._open.pop(server, None)
                raise


def _resident_child() -> int:
    """The resident bridge: the server's spec, then requests, a line each;
    a reply line (``_REPLY`` + JSON) for each request. Only replies go to the
    original stdout; anything else printed goes to stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = json.loads(sys.stdin.readline())["server"]
    server = ServerSpec(name=spec["name"], command=spec["command"], args=tuple(spec["args"]),
                        env=tuple(tuple(pair) for pair in spec["env"]), cwd=spec["cwd"])

    def reply(message: dict) -> None:
        out.write(_REPLY + json.dumps(message) + "\n")
        out.flush()

    import anyio

    async def serve() -> None:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        with open(os.devnull, "w") as errlog:
            async with stdio_client(_params(server), errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    while True:
                        line = await anyio.to_thread.run_sync(sys.stdin.readline)
                        if not line:
                            return
                        request = json.loads(line)
                        reply({"result": await _act(session, request["name"],
                                                    request["arguments"])})

    try:
        anyio.run(serve)
    except BaseException as exc:  # noqa: BLE001 -- exception groups from task groups
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        reply({"down": f"MCP server {server.name!r}: {_describe(exc)}"})
        return 1
    return 0


def _child() -> int:
    if sys.argv[1:] == ["--resident"]:
        return _resident_child()
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


def _params(server: ServerSpec) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=server.command, args=list(server.args),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **dict(server.env)},
        cwd=server.cwd)


async def _act(session: Any, name: str | None, arguments: dict | None) -> Any:
    """List the tools (``name`` None) or call one, as plain data."""
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


async def _session(server: ServerSpec, timeout: float, name: str | None, arguments: dict | None):
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    with open(os.devnull, "w") as errlog:
        with anyio.fail_after(timeout):
            async with stdio_client(_params(server), errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await _act(session, name, arguments)


def _schema(tool: Any) -> dict:
    return getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}


def _dump(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else str(value)


if __name__ == "__main__":
    sys.exit(_child())
