"""General over MCP: a general_agent task's own MCP tools, passed through
as ``<server>__<name>`` tools of its session (camg.mcp_server), listed with
the task's input schemas and played by the mcp SDK's client to the judged
1.0 on the session's General service (general_fixtures.py; shared with
test_general_episodes.py, so about 23 s here beyond it, 2 min alone).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp import Client as McpClient

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def test_general_agent_task_tools_passed_through_over_mcp(general_service, general_demo,
                                                          general_prepared, fake_judge):
    """General's general_agent oracle over MCP, each of its tool actions
    called as the task's own tool (<server>__<name>): judged 1.0."""
    from general_fixtures import tasks_of
    from tools.judge_stub import Reply
    fake_judge.default = Reply(text='{"score": 1, "reason": "names it"}')
    task = tasks_of(general_prepared, "general_agent")[0]
    actions = json.loads((general_demo["out"] / f"{task['task_id']}.oracle.json").read_text())

    async def play():
        async with McpClient(f"{general_service.url}/mcp?task_id={task['task_id']}&wait_s=120",
                             read_timeout_seconds=600) as client:
            first = client.session.initialize_result.meta["camg/episode"]["observation"]
            listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}
            for tool in first["tools"]:
                name = f"{tool['server']}__{tool['name']}"
                assert listed[name] == (tool["input_schema"] or {"type": "object"}), name
            reply, passed = None, 0
            for action in actions:
                action = dict(action)
                operation = action.pop("operation")
                if operation == "tool":
                    name = f"{action['server']}__{action['name']}"
                    reply = await client.call_tool(name, action.get("arguments") or {})
                    passed += 1
                else:
                    reply = await client.call_tool(operation, action)
                assert reply.is_error is False, reply.structured_content
                if reply.structured_content["done"]:
                    break
            return reply.structured_content, passed

    reply, passed = asyncio.run(play())
    assert passed >= 1
    assert reply["done"] is True and reply["reward"] == 1.0 and reply["failure_class"] is None
