"""Shop regrade: the stored purchase through the reward function again gives
the episode's own reward (real index of the 1k test catalog)."""

from __future__ import annotations

import random

import pytest

from camg.config import task_manifest as manifest
from camg.environment import ServiceContext, Submission
from camg.errors import GraderError
from camg.episodes.submissions import SubmissionStore
from environments.shop.environment import ShopEnvironment
from tests.support import shop_testing as testing


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    out, settings = testing.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    env = ShopEnvironment(ServiceContext("shop", str(tmp_path_factory.mktemp("shop")),
                                         dict(settings, jvm_heap_mb=testing.TEST_HEAP_MB)), tasks)
    env.start()
    yield env
    env.stop()


def play(env, task, episode_id, policy):
    episode = env.create_episode(task, seed=None, episode_id=episode_id)
    episode.reset()
    for _ in range(60):
        step = episode.step(policy(episode))
        if step.done:
            return episode, step
    raise AssertionError("the episode did not end")


def test_regrade_of_stored_purchases_gives_the_same_reward(env, tmp_path):
    store = SubmissionStore(tmp_path)
    tasks = random.Random(3).sample(list(env.tasks), 4)
    rewards = []
    for i, task in enumerate(tasks):
        # the oracle on even tasks, on odd ones a first-result purchase
        policy = (lambda ep: ep.reference_action()) if i % 2 == 0 else (
            lambda ep: {"action": "click[buy now]"} if ep.store.page == "item" else
            {"action": f"search[{task.data['goal']['instruction_text'][:80]}]"}
            if ep.store.page == "search" else
            {"action": f"click[{ep.store.results[0].lower()}]"})
        episode, step = play(env, task, f"regrade-{i}", policy)
        ref = store.put(episode.submission())
        assert ref["sha256"] is None and ref["meta"]["purchase"]["asin"]  # no file: meta only
        grade = env.regrade(task, store.get(ref))
        assert grade.reward == step.reward
        assert grade.outcome["purchase"] == episode.purchase
        assert grade.outcome["reward_info"] == episode.reward_info
        rewards.append(step.reward)
    assert max(rewards) == pytest.approx(1.0, abs=0.35) and min(rewards) < max(rewards)


def test_an_episode_without_a_purchase_regrades_to_zero(env):
    task = env.tasks[3]
    episode = env.create_episode(task, seed=None, episode_id="budget")
    episode.reset()
    step = None
    for _ in range(env.settings.max_steps):
        step = episode.step({"action": "click[nothing]"})
    assert step.done and step.reward == 0.0
    grade = env.regrade(task, episode.submission())
    assert grade.reward == 0.0 and grade.outcome["reward_info"] == {"truncated": True}


def test_a_purchase_the_grader_cannot_score_is_a_grader_error(env):
    with pytest.raises(GraderError):
        env.regrade(env.tasks[0], Submission(meta={"purchase": {"asin": "NOPE", "options": {}}}))
