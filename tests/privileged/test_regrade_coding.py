"""Coding regrade: a finished gold episode's stored diff, graded again in a
fresh grader sandbox, earns the same reward (one episode: it is a real
SWE-smith test run twice)."""

from __future__ import annotations

import asyncio

import pytest

from camg.web import http_wire as wire
from camg.episodes.manager import EpisodeManager
from camg.episodes.outcomes import OutcomeLog
from camg.config.service_config import Limits
# The demo task set, its helper and environment, as the Coding acceptance builds them.
from test_coding_episodes import FINISH, env, prepared, shell, write_file  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def test_regrade_of_a_gold_episode_gives_the_same_reward(env, tmp_path):  # noqa: F811
    task = env.tasks[0]
    outcomes = OutcomeLog(tmp_path)
    manager = EpisodeManager(env, capacity=1, limits=Limits(), config_hash="h", outcomes=outcomes)

    async def scenario():
        created = await manager.create(wire.CreateEpisode(task_id=task.task_id))
        eid = created["episode_id"]
        for action in (write_file("/tmp/fix.diff", task.data["patch"]),
                       shell("git apply -R /tmp/fix.diff"), FINISH):
            last = await manager.step(eid, wire.StepRequest(action))
        return eid, last, await manager.regrade(eid)

    try:
        eid, last, regraded = asyncio.run(scenario())
        assert last["done"] and last["reward"] == 1.0
        assert regraded["reward"] == 1.0 and regraded["failure_class"] is None
        assert regraded["same_grader"] is True and regraded["grader_hash"].startswith("sha256:")
        assert regraded["integrity"] == "ok"
        original, again = outcomes.read()
        assert original["episode_id"] == again["episode_id"] == eid
        assert again["regrade_of"]["reward"] == original["reward"] == 1.0
        assert original["submission"]["bytes"] > 0 and again["submission"] == original["submission"]
    finally:
        asyncio.run(manager.shutdown())
        outcomes.close()
