"""At grading, a general_agent tool server that does not answer gets a
second, longer chance before the episode is called ``mcp_backend_down``:
a server the agent broke fails both times (an obstruction the null proof
then shows), one a busy host slowed answers the second time (the episode
is graded, not blamed on the agent)."""

from __future__ import annotations

import pytest

from tests.support import mimo_tasks  # noqa: F401  (puts the MiMo runtime on the path)

from mimoagent.environments.datasets import general_agent  # noqa: E402
from mimoagent.tools import mcp_bridge  # noqa: E402


def _bridge(monkeypatch, answers: dict[str, list[bool]]) -> list[tuple[str, float]]:
    """list_tools answering per server from ``answers`` (True: it lists)."""
    asked: list[tuple[str, float]] = []

    def list_tools(server, timeout):
        asked.append((server, timeout))
        if not answers[server].pop(0):
            raise mcp_bridge.ToolServerDown(f"MCP server {server!r}: no answer in {timeout:g} s")
        return []

    monkeypatch.setattr(mcp_bridge, "list_tools", list_tools)
    return asked


def test_every_server_answering_is_no_failure(monkeypatch):
    asked = _bridge(monkeypatch, {"tickets": [True], "crm": [True]})
    assert general_agent.servers_down(["tickets", "crm"]) is None
    first = general_agent.LIST_TIMEOUT_S
    assert asked == [("tickets", first), ("crm", first)]


def test_a_slow_server_gets_a_longer_second_chance(monkeypatch):
    asked = _bridge(monkeypatch, {"tickets": [False, True], "crm": [True]})
    assert general_agent.servers_down(["tickets", "crm"]) is None
    longer = general_agent.LIST_TIMEOUT_S * general_agent.SECOND_CHANCE
    assert asked[:2] == [("tickets", general_agent.LIST_TIMEOUT_S), ("tickets", longer)]
    assert longer > general_agent.LIST_TIMEOUT_S


@pytest.mark.parametrize("first", ["tickets", "crm"])
def test_a_server_down_twice_is_named(monkeypatch, first):
    other = "crm" if first == "tickets" else "tickets"
    _bridge(monkeypatch, {first: [False, False], other: [True]})
    order = [first, other] if first == "tickets" else [other, first]
    down = general_agent.servers_down(order)
    assert down is not None and repr(first) in down
