"""General regrade: a general_agent episode's stored verifier detail before
the judge again gives the episode's reward; opensource-code episodes (graded
inside their container, which is gone) answer regrade_unsupported."""

from __future__ import annotations

import json

import pytest

from camg import errors
from camg.environment import ServiceContext, Submission, Task
from environments.general.environment import GeneralEnvironment
from tests.support.fake_judge import FakeJudge, Reply
from tests.support.general_agent import IMAGE, judged_episode

DETAIL = {"results": [{"id": "r", "score": 1.0, "passed": True, "gate": False}],
          "judge_requests": [{"id": "l", "weight": 1.0, "system": "s", "prompt": "p"}],
          "items": [{"id": "r", "weight": 1.0}, {"id": "l", "weight": 1.0}]}


@pytest.mark.parametrize("binarize", [False, True])
def test_general_agent_regrade_re_asks_the_judge(tmp_path, binarize):
    with FakeJudge() as fake:
        env, episode = judged_episode(tmp_path, DETAIL, fake.url, timeout_s=2,
                                      settings={"binarize": binarize})
        task = episode.task
        fake.default = Reply(text='{"score": 0}')
        reward = episode.grade()
        submission = episode.submission()
        assert json.loads(submission.data) == DETAIL
        asked = len(fake.requests)
        grade = env.regrade(task, submission)
        assert grade.reward == reward == (0.0 if binarize else 0.5)
        assert len(fake.requests) == asked + 1 and grade.outcome["judge"][0]["item"] == "l"
        fake.default = Reply(status=500)
        with pytest.raises(errors.JudgeError):
            env.regrade(task, submission)
        env.judge.close()


def test_opensource_code_cannot_be_regraded(tmp_path):
    task = Task("oc", {"kind": "opensource-code", "image": IMAGE, "instance_id": "oc"})
    env = GeneralEnvironment(ServiceContext("general", str(tmp_path), {}), [task])
    episode = env.create_episode(task, seed=None, episode_id="e")
    episode.verifier_exit = 0
    with pytest.raises(errors.RegradeUnsupported, match="inside their container"):
        env.regrade(task, episode.submission())
