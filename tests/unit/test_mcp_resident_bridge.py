"""An episode's tool calls go through one resident bridge per server
(mimoagent.tools.mcp_bridge.Sessions): one server process for every call,
a missed deadline or a dead server is ``ToolServerDown`` with the bridge
and its server gone (the next call starts afresh), and closing leaves no
process behind. Grading still lists a fresh server one-shot."""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from tests.support import mimo_tasks  # noqa: F401  (puts the MiMo runtime on the path)

from mimoagent.tools import mcp_bridge  # noqa: E402

SERVER = textwrap.dedent(
    """
    import os, time
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("probe")

    @app.tool()
    def pid() -> int:
        return os.getpid()

    @app.tool()
    def nap(seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    @app.tool()
    def die() -> str:
        os._exit(3)

    @app.tool()
    def refuse() -> str:
        raise ValueError("not today")

    app.run()
    """
)


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SERVER)
    return mcp_bridge.ServerSpec.for_script("probe", str(script), cwd=str(tmp_path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # reaped meanwhile (ENOENT, or ESRCH mid-read)
        return False


def _gone(pid: int, within: float = 10.0) -> bool:
    """``pid`` dead within ``within`` seconds (SIGKILL is delivered at once,
    the exit a moment later)."""
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _server_pid(sessions, server) -> int:
    return int(sessions.call_tool(server, "pid", {}, timeout=30)["content"][0])


def test_every_call_meets_one_resident_server_and_close_leaves_nothing(server):
    sessions = mcp_bridge.Sessions()
    try:
        names = {t["name"] for t in sessions.list_tools(server, timeout=30)}
        assert names == {"pid", "nap", "die", "refuse"}
        first = _server_pid(sessions, server)
        # a tool's own error is its answer, not a server down
        refused = sessions.call_tool(server, "refuse", {}, timeout=30)
        assert refused["is_error"] and "refuse" in refused["error"]
        started = time.monotonic()
        assert all(_server_pid(sessions, server) == first for _ in range(5))
        # a call is a line each way: far under an interpreter's start
        assert (time.monotonic() - started) / 5 < 0.5
        bridge = sessions._open[server].proc.pid
    finally:
        sessions.close()
    assert _gone(first) and _gone(bridge)
    sessions.close()  # idempotent


def test_a_missed_deadline_kills_bridge_and_server_and_the_next_call_starts_afresh(server):
    sessions = mcp_bridge.Sessions()
    try:
        first = _server_pid(sessions, server)
        with pytest.raises(mcp_bridge.ToolServerDown, match="no answer by its deadline"):
            sessions.call_tool(server, "nap", {"seconds": 60}, timeout=-mcp_bridge._CHILD_GRACE_S + 1)
        assert _gone(first)
        again = _server_pid(sessions, server)
        assert again != first and _alive(again)
    finally:
        sessions.close()


def test_a_server_that_dies_is_down_then_replaced(server):
    sessions = mcp_bridge.Sessions()
    try:
        first = _server_pid(sessions, server)
        with pytest.raises(mcp_bridge.ToolServerDown, match="probe"):
            sessions.call_tool(server, "die", {}, timeout=30)
        assert _gone(first)
        assert _server_pid(sessions, server) != first
    finally:
        sessions.close()


def test_grading_meets_a_fresh_server_one_shot(server):
    listed = mcp_bridge.list_tools(server, timeout=30)
    assert {t["name"] for t in listed} == {"pid", "nap", "die", "refuse"}
