"""AutoResearch regrade: a submitted CSV's stored bytes through the private
grader again earn the episode's own reward; a missing file earns 0 again."""

from __future__ import annotations

import pytest

from camg.episodes.submissions import SubmissionStore
# The research image, roots, helper and environment as the acceptance builds them.
from test_autoresearch_episodes import (SUBMIT, ar_helper, env, reference,  # noqa: F401
                                        research_image, roots, run_episode, shell, write_file)

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def test_regrade_of_stored_submissions_gives_the_same_reward(env, roots, tmp_path):  # noqa: F811
    store = SubmissionStore(tmp_path)
    task = env.tasks[0]
    _, outputs, reward, episode = run_episode(env, task, [
        write_file("/workspace/solve.py", reference(roots, task.task_id)),
        shell("python /workspace/solve.py"), SUBMIT], episode_id="regrade-ref")
    assert outputs[1]["exit_code"] == 0, outputs[1]
    ref = store.put(episode.submission())
    assert ref["bytes"] > 0 and ref["sha256"].startswith("sha256:")
    grade = env.regrade(task, store.get(ref))
    assert reward >= 0.9 and grade.reward == reward
    assert grade.outcome["grade"]["valid"] is True

    _, _, nothing, missing = run_episode(env, task, [SUBMIT], episode_id="regrade-missing")
    ref = store.put(missing.submission())
    assert ref["sha256"] is None and ref["meta"] == {"missing": True}
    again = env.regrade(task, store.get(ref))
    assert nothing == again.reward == 0.0 and again.outcome["grade"]["submitted"] is False
