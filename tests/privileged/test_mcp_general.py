"""General over MCP: a general_agent task's own MCP tools, passed through
as ``<server>__<name>`` tools of its session (camg.web.mcp_server), listed with
the task's input schemas and played by the mcp SDK's client to the judged
1.0 on the session's General service, and a code task's no-op to 0.0 over
both the SDK's and openenv's MCP clients (general_fixtures.py; shared with
test_general_episodes.py, so about 23 s here beyond it, 2 min alone).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.support.token_clients import mcp_client as McpClient

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


def test_noop_to_zero_over_mcp(general_service, general_prepared):
    """A code task finished at once, over the mcp SDK's client and over
    openenv's MCPToolClient (its /ws MCP messages): 0.0 each."""
    from general_fixtures import tasks_of
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient
    from tests.support.token_clients import with_token
    task = tasks_of(general_prepared, "opensource-code")[0]

    async def play():
        async with McpClient(f"{general_service.url}/mcp?task_id={task['task_id']}&wait_s=120",
                             read_timeout_seconds=600) as client:
            assert [t.name for t in (await client.list_tools()).tools] == [
                "shell", "finish", "tool"]
            sdk = (await client.call_tool("finish", {})).structured_content
        async with with_token(MCPToolClient)(base_url=general_service.url,
                                             message_timeout_s=600) as env:
            await env.reset(task_id=task["task_id"])
            assert [t.name for t in await env.list_tools()] == ["shell", "finish", "tool"]
            stock = await env.step(CallToolAction(tool_name="finish", arguments={}))
        return sdk, stock

    sdk, stock = asyncio.run(play())
    assert sdk["done"] is True and sdk["reward"] == 0.0 and sdk["failure_class"] is None, sdk
    assert stock.done is True and stock.reward == 0.0
    assert stock.observation.result["failure_class"] is None
