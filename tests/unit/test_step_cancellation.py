"""A step whose caller is cancelled mid-way (a trainer's hang-up past the
server's grace, a closed MCP session, a shutdown) still completes: the
environment's answer is counted and recorded, the episode stays busy until
the environment returns, and a step that ends the episode still grades and
writes its outcome record. The manager runs a step in the caller's own task
(camg/episodes/manager.py says why), so this is what keeps that safe."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from camg.web import http_wire as wire
from camg.environment import Step, Task
from camg.episodes.manager import EpisodeManager
from camg.errors import EpisodeBusy
from camg.episodes.outcomes import OutcomeLog
from camg.config.service_config import Limits
from tests.support.polling import until


class GatedEnv:
    name = "gated"
    action_schema = {"type": "object"}
    tasks = [Task("t", {})]

    def __init__(self) -> None:
        self.step_gate = threading.Event()
        self.grade_gate = threading.Event()
        self.in_step = threading.Event()
        self.in_grade = threading.Event()

    def create_episode(self, task, *, seed, episode_id):
        return GatedEpisode(self)


class GatedEpisode:
    def __init__(self, env: GatedEnv) -> None:
        self.env = env

    def reset(self):
        return {"text": "ready"}

    def step(self, action):
        if action.get("gated"):
            self.env.in_step.set()
            assert self.env.step_gate.wait(10)
        return Step({"text": f"did {action['n']}"}, done=bool(action.get("done")))

    def grade(self):
        self.env.in_grade.set()
        assert self.env.grade_gate.wait(10)
        return 1.0

    def close(self):
        pass

    def state(self):
        return {}


@pytest.fixture
def world(tmp_path):
    env = GatedEnv()
    manager = EpisodeManager(env, capacity=2, limits=Limits(), config_hash="h",
                             outcomes=OutcomeLog(tmp_path))
    yield env, manager, tmp_path
    manager.threads.shutdown()


def step(manager, eid, **action):
    return manager.step(eid, wire.StepRequest(action=action))


def trajectory(tmp_path, eid) -> list[dict]:
    path = tmp_path / "trajectories" / f"{eid}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_cancelled_steps_answer_is_still_counted_and_recorded(world):
    env, manager, tmp_path = world

    async def scenario():
        eid = (await manager.create(wire.CreateEpisode(episode_id="e1")))["episode_id"]
        caller = asyncio.ensure_future(step(manager, eid, n=1, gated=True))
        await until(env.in_step.is_set)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        # The environment is still stepping: the episode stays busy.
        with pytest.raises(EpisodeBusy):
            await step(manager, eid, n=2)
        assert manager.state(eid)["step_count"] == 1
        env.step_gate.set()
        await until(lambda: not manager.records[eid].busy)
        assert manager.records[eid].observation == {"text": "did 1"}
        after = await step(manager, eid, n=2)
        assert after["step"] == 2 and after["observation"] == {"text": "did 2"}
        return eid

    eid = asyncio.run(scenario())
    steps = [e for e in trajectory(tmp_path, eid) if e["event"] == "step"]
    assert [(e["step"], e["observation"]["text"]) for e in steps] == [(1, "did 1"), (2, "did 2")]


def test_a_step_that_ends_the_episode_grades_and_records_without_its_caller(world):
    env, manager, tmp_path = world

    async def scenario():
        eid = (await manager.create(wire.CreateEpisode(episode_id="e2")))["episode_id"]
        caller = asyncio.ensure_future(step(manager, eid, n=1, done=True))
        await until(env.in_grade.is_set)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        with pytest.raises(EpisodeBusy):  # still grading
            await step(manager, eid, n=2)
        env.grade_gate.set()
        # done once its detached end has run whole: the record written, the
        # episode among the finished and released (the status says "done"
        # before the record is written)
        await until(lambda: eid in manager.finished and not manager.finished[eid].busy)
        return eid, manager.state(eid)

    eid, state = asyncio.run(scenario())
    assert state["reward"] == 1.0 and state["step_count"] == 1
    [record] = [json.loads(line) for line in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    assert record["episode_id"] == eid and record["reward"] == 1.0 and record["status"] == "done"
    assert [e["event"] for e in trajectory(tmp_path, eid)] == ["reset", "end"]


def test_a_step_cancelled_before_its_call_ends_past_its_deadline_is_a_timeout(tmp_path):
    env = GatedEnv()
    manager = EpisodeManager(env, capacity=2, limits=Limits(action_timeout_s=0.2),
                             config_hash="h", outcomes=OutcomeLog(tmp_path))

    async def scenario():
        eid = (await manager.create(wire.CreateEpisode(episode_id="e3")))["episode_id"]
        caller = asyncio.ensure_future(step(manager, eid, n=1, gated=True))
        await until(env.in_step.is_set)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await until(lambda: eid in manager.finished and not manager.finished[eid].busy)
        env.step_gate.set()
        return manager.state(eid)

    try:
        state = asyncio.run(scenario())
    finally:
        manager.threads.shutdown()
    assert state["reward"] is None and state["failure_class"] == "timeout"
