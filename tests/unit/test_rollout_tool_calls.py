"""``--policy openai`` with native tool calls (issue 28.3): the request
carries /schema's "tools", the model's tool calls become actions by the
service's own inverse (camg_client.tool_calls, which camg.web.action_tools
imports), and an endpoint that refuses tools gets the text protocol.

The "model" is scripted (tests/support/tool_model.py) behind the fake
OpenAI server speaking the real chat-completions protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from camg.web import action_tools
from camg_client import Client
from camg_client.tool_calls import ToolCallError, ToolCalls
from tests.support.fake_judge import FakeJudge, Reply
from tests.support.services import REPO
from tests.support.tool_model import text_guesser, tool_guesser, without_tools
from devtools.harness.counter_env import ACTION_SCHEMA as COUNTER_SCHEMA


def rollout(svc, server, episodes=3):
    return subprocess.run(
        [sys.executable, "-m", "camg_client", "--routes", str(svc.config_path.parent / "routes.json"),
         "--env", "counter", "--policy", "openai", "--episodes", str(episodes), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "CAMG_POLICY_URL": server.url, "CAMG_POLICY_MODEL": "scripted",
             "CAMG_POLICY_KEY": "k"})


def summary_of(stdout: str) -> dict:
    return dict(line.split(None, 1) for line in stdout.splitlines() if line.strip())


def test_the_policy_plays_through_native_tool_calls(counter_service):
    svc = counter_service(capacity=2)
    with FakeJudge(responder=tool_guesser) as server:
        proc = rollout(svc, server)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = summary_of(proc.stdout)
    assert body["reward_min"] == "1" and body["errors"] == "0" and body["rewarded"] == "3"
    published = Client(svc.url).schema()["tools"]
    assert {t["function"]["name"] for t in published} >= {"guess", "finish"}
    # every request offered exactly the service's tools, and every hint went
    # back as the result of the call it answers
    for request in server.requests:
        assert request.body["tools"] == published
        messages = request.body["messages"]
        calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]]
        results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert calls == results
    assert "refuses tools" not in proc.stderr


def test_an_endpoint_refusing_tools_gets_the_text_protocol(counter_service):
    svc = counter_service(capacity=2)
    with FakeJudge(responder=without_tools(text_guesser)) as server:
        proc = rollout(svc, server)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert summary_of(proc.stdout)["reward_min"] == "1"
    assert "refuses tools" in proc.stderr
    # asked once, then text for good: the system message carries the schema
    offered = [r for r in server.requests if "tools" in r.body]
    assert len(offered) == 1
    for request in server.requests[1:]:
        assert '"guess"' in request.body["messages"][0]["content"]


def test_a_refusal_that_is_not_about_tools_stays_an_error(counter_service):
    svc = counter_service(capacity=2)
    with FakeJudge(default=Reply(status=400, error_type="invalid_request_error")) as server:
        proc = rollout(svc, server, episodes=1)
    assert proc.returncode == 1
    body = summary_of(proc.stdout)
    assert body["errors"] == "1" and body["rewarded"] == "0"
    # no second request in text mode: a 400 not naming tools is no fallback
    assert all("tools" in r.body for r in server.requests)


def test_a_call_to_a_tool_that_does_not_exist_scores_the_minimum(counter_service):
    """The model's call stands for no action: the policy failed, 0.0. Left
    unrewarded, the episode would be masked, and a policy could hide every
    episode it expects to lose behind one garbled call."""
    from tests.support.tool_model import tool_call_reply
    svc = counter_service(capacity=2)
    with FakeJudge(default=tool_call_reply("scripted", "teleport", {})) as server:
        proc = rollout(svc, server, episodes=1)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = summary_of(proc.stdout)
    assert body["errors"] == "0" and body["rewarded"] == "1" and body["reward_max"] == "0"
    assert body["invalid_actions"] == "1" and len(server.requests) == 1


@pytest.mark.parametrize("name,schema,call,action", [
    ("counter", COUNTER_SCHEMA, ("guess", '{"value": 3}'), {"operation": "guess", "value": 3}),
    ("counter", COUNTER_SCHEMA, ("finish", ""), {"operation": "finish"}),
    ("shop", {"type": "object", "required": ["action"], "additionalProperties": False,
              "properties": {"action": {"type": "string"}}},
     ("shop", {"action": "search[mug]"}), {"action": "search[mug]"}),
])
def test_the_client_maps_calls_as_the_service_does(name, schema, call, action):
    tools = action_tools.tools(schema, name=name)
    client_side = ToolCalls({"action": schema, "tools": tools})
    assert client_side.action(*call) == action_tools.action(schema, *call, name=name) == action


@pytest.mark.parametrize("call", [("fly", "{}"), ("guess", "[1]"), ("guess", "{not json"),
                                  ("guess", {"operation": "finish"})])
def test_calls_standing_for_no_action_are_refused_on_both_sides(call):
    tools = action_tools.tools(COUNTER_SCHEMA, name="counter")
    with pytest.raises(ToolCallError):
        ToolCalls({"action": COUNTER_SCHEMA, "tools": tools}).action(*call)
    with pytest.raises(action_tools.InvalidAction):
        action_tools.action(COUNTER_SCHEMA, *call, name="counter")
