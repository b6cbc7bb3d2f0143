"""The rollout CLI (python -m camg_client) and the trainer clients against a real camg.serve process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from camg_client import AsyncClient, Client, ServiceError
from camg_client import client as client_mod
from tests.support.services import REPO


def run_rollout(routes, *args):
    return subprocess.run([sys.executable, "-m", "camg_client", "--routes", str(routes),
                           "--env", "counter", "--no-progress", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def summary_of(stdout: str) -> dict:
    return dict(line.split(None, 1) for line in stdout.splitlines() if line.strip())


def test_references_are_refused_unless_the_deployment_enables_them(counter_service):
    svc = counter_service()
    client = Client(svc.url)
    created = client.create()
    with pytest.raises(client_mod.PermissionDenied, match="references are not enabled"):
        client.reference(created["episode_id"])
    assert client.metadata()["references"] is False


def test_oracle_earns_the_maximum_and_noop_the_minimum(counter_service, tmp_path):
    svc = counter_service(references=True, capacity=4)
    routes = svc.config_path.parent / "routes.json"
    out = tmp_path / "run.jsonl"
    oracle = run_rollout(routes, "--policy", "oracle", "--episodes", "12", "--concurrency", "6",
                         "--out", str(out))
    assert oracle.returncode == 0, oracle.stderr + oracle.stdout
    body = summary_of(oracle.stdout)
    assert body["episodes"] == "12" and body["rewarded"] == "12" and body["errors"] == "0"
    assert body["reward_min"] == "1" and body["failure_classes"] == "{}"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and all(line["reward"] == 1.0 for line in lines)
    # every line carries its receipt, distinct seqs of the service's signed log
    seqs = sorted(line["outcome_seq"] for line in lines)
    assert len(set(seqs)) == 12 and body["outcome_seq_max"] == str(seqs[-1])
    # seeds 0..11 over the 5 tasks: every task ran
    assert len({line["task_id"] for line in lines}) == 5
    noop = run_rollout(routes, "--policy", "noop", "--episodes", "5", "--concurrency", "2")
    assert noop.returncode == 0, noop.stderr
    assert summary_of(noop.stdout)["reward_max"] == "0"
    # every episode was closed afterwards: nothing is left running
    assert Client(svc.url).list()["active"] == 0


def test_rollout_refuses_an_unknown_environment(tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"coding": "http://127.0.0.1:1"}))
    proc = run_rollout(routes, "--policy", "noop")
    assert proc.returncode == 2 and "'counter' is not in" in proc.stderr


def test_async_client_waits_out_capacity_and_types_errors(counter_service):
    svc = counter_service(capacity=1)

    async def scenario():
        async with AsyncClient(svc.url) as client:
            first = await client.create()
            with pytest.raises(client_mod.AtCapacity) as info:
                await client.create()
            assert info.value.status == 429 and info.value.retry_after >= 1

            async def release_later():
                await asyncio.sleep(0.5)
                await client.close(first["episode_id"])

            releaser = asyncio.create_task(release_later())
            second = await client.create(wait=30)
            await releaser
            with pytest.raises(client_mod.InvalidAction):
                await client.step(second["episode_id"], {"operation": "fly"})
            done = await client.step(second["episode_id"], {"operation": "finish"})
            assert done["done"] is True
            with pytest.raises(client_mod.EpisodeDone):
                await client.step(second["episode_id"], {"operation": "finish"})
            with pytest.raises(client_mod.NotFound):
                await client.get("nope")
            assert isinstance(info.value, ServiceError)

    asyncio.run(scenario())


def test_openai_policy_plays_through_a_scripted_model(counter_service, tmp_path):
    """--policy openai against a local server speaking the real chat protocol:
    the scripted "model" binary-searches the counter's hidden number from the
    observations it is sent and answers JSON actions wrapped in prose."""
    from tests.support.fake_judge import FakeJudge, Reply

    def model(request):
        messages = request.body["messages"]
        assert messages[0]["role"] == "system" and '"guess"' in messages[0]["content"]
        lo, hi = 0, 100
        guesses = [json.loads(m["content"].split("action: ", 1)[1])["value"]
                   for m in messages if m["role"] == "assistant"]
        hints = [json.loads(m["content"]).get("text") for m in messages if m["role"] == "user"][1:]
        for guess, hint in zip(guesses, hints):
            lo, hi = (guess + 1, hi) if hint == "higher" else (lo, guess - 1)
        return Reply(text='my next action: {"operation": "guess", "value": %d}' % ((lo + hi) // 2))

    svc = counter_service(capacity=2)
    routes = svc.config_path.parent / "routes.json"
    # an endpoint without tools: the policy falls back to this text protocol
    # (native tool calls: tests/unit/test_rollout_tool_calls.py)
    from tests.support.tool_model import without_tools
    with FakeJudge(responder=without_tools(model)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "camg_client", "--routes", str(routes), "--env", "counter",
             "--policy", "openai", "--episodes", "3", "--no-progress"], cwd=REPO,
            capture_output=True, text=True, timeout=300,
            env={**__import__("os").environ, "CAMG_POLICY_URL": server.url,
                 "CAMG_POLICY_MODEL": "scripted", "CAMG_POLICY_KEY": "k"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = summary_of(proc.stdout)
    assert body["reward_min"] == "1" and body["errors"] == "0"


def test_an_invalid_action_scores_the_minimum_never_a_masked_null(counter_service):
    """A policy's action the service refuses (off the schema, a tool call
    that names no action) is the policy's failure: 0.0, not reward None,
    which a trainer would mask."""
    from camg_client import rollout
    from camg_client.tool_calls import ToolCallError

    svc = counter_service()

    class OffSchema:
        async def act(self, client, episode_id, observation):
            return {"operation": "guess", "value": "not a number"}

    class Garbled:
        async def act(self, client, episode_id, observation):
            raise ToolCallError("unknown tool 'hack'")

    async def play(policy):
        async with AsyncClient(svc.url) as client:
            return await rollout.run_episode(client, policy, task_id=None, seed=0, wait=0)

    for policy in (OffSchema(), Garbled()):
        result = asyncio.run(play(policy))
        assert result.reward == 0.0 and result.error is None, result
        assert result.invalid_action and result.line()["invalid_action"] == result.invalid_action
    assert Client(svc.url).list()["active"] == 0
