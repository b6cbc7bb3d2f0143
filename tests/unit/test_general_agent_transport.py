"""The general_agent transport in process: tools over MCP stdio, answer.md, rule verifier."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.support import mimo_tasks

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as uid 2000 (CI runs as root)")

from mimoagent.transport import common, general  # noqa: E402
from mimoagent.verify.general import aggregate  # noqa: E402


@pytest.fixture(params=[0, 1], ids=["sales", "inventory"])
def task(request):
    base = mimo_tasks.world_dir("mimo-general.")
    root, oracle, paths = mimo_tasks.general_task(base, request.param)
    env = general.bind(root, reap=False, **paths)()
    yield env, oracle, base
    shutil.rmtree(base, ignore_errors=True)


def act(**kw):
    return general.GeneralAction(**kw)


def detail(base):
    return json.loads((base / "verifier" / "reward_detail.json").read_text())


def test_oracle_passes_every_rule_and_leaves_judge_requests(task):
    env, oracle, base = task
    obs = env.reset()
    assert obs.tools and all({"server", "name", "input_schema"} <= set(t) for t in obs.tools)
    for action in oracle[:-1]:
        out = env.step(act(**action))
        assert out.exit_code == 0, out.output
    done = env.step(act(**oracle[-1]))
    assert done.done and done.reward is None and done.metadata["pending_judge"]
    assert (base / "workspace" / "answer.md").read_text() == oracle[-1]["answer"]
    d = detail(base)
    assert all(r["passed"] for r in d["results"]), d["results"]
    assert d["judge_requests"] and all(r["pass_anchor"] and r["evidence"][0]["state"] == "ok"
                                       for r in d["judge_requests"])
    assert d["transport_integrity"] == {"findings": [], "processes_killed": 0}
    assert done.integrity_evidence == []
    assert env.step(act(operation="shell", command="true")) is done


def test_noop_fails_rules(task):
    env, oracle, base = task
    env.reset()
    env.step(act(operation="finish", answer="nothing done"))
    d = detail(base)
    scores = {r["id"]: r["score"] for r in d["results"]}
    scores.update({r["id"]: 1.0 for r in d["judge_requests"]})  # even a lenient judge
    items = d["items"]
    assert aggregate(items, scores) < 0.5


def test_agent_cannot_read_state_or_rubric(task):
    env, oracle, base = task
    env.reset()
    out = env.step(act(operation="shell", command=f"cat {base}/tasks/*/verifier_meta.json; "
                                                  f"ls {base}/state; id -u"))
    assert "Permission denied" in out.output and out.output.strip().endswith("2000")


def test_tool_errors_are_observations(task):
    env, oracle, base = task
    env.reset()
    unknown = env.step(act(operation="tool", server="nope", name="x"))
    assert unknown.exit_code == 1 and "unknown tool" in unknown.output
    server = env.task.tools and next(iter(env.task.tools))
    first = env.task.tools[server][0]["name"]
    bad = env.step(act(operation="tool", server=server, name=first, arguments={"bogus": 1}))
    assert not bad.done


def test_gate_failure_zeroes_and_skips_judge(task):
    env, oracle, base = task
    env.reset()
    env.step(act(operation="shell", command="for f in *; do echo x >> \"$f\"; done"))
    done = env.step(act(operation="finish", answer="x"))
    assert done.reward == 0.0 and not done.metadata["pending_judge"]
    assert detail(base)["gate_failed"]


def test_broken_tool_server_masks(task):
    env, oracle, base = task
    env.reset()
    for script in (env.task.task_dir / "tools").glob("*.py"):
        script.write_text("raise SystemExit(3)\n")
    with pytest.raises(common.InfraError) as info:
        env.step(act(operation="finish", answer="x"))
    assert info.value.failure_class == "grader_error"
