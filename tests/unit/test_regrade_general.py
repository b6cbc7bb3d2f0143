"""General regrade: a general_agent episode's stored verifier detail before
the judge again gives the episode's reward; opensource-code episodes (graded
inside their container, which is gone) answer regrade_unsupported."""

from __future__ import annotations

import io
import json
import tarfile
import types

import pytest

from camg import errors
from camg.environment import ServiceContext, Submission, Task
from camg.judge import Judge, JudgeConfig
from daemons.general.environment import GeneralEnvironment
from tests.support.fake_judge import FakeJudge, Reply

DETAIL = {"results": [{"id": "r", "score": 1.0, "passed": True, "gate": False}],
          "judge_requests": [{"id": "l", "weight": 1.0, "system": "s", "prompt": "p"}],
          "items": [{"id": "r", "weight": 1.0}, {"id": "l", "weight": 1.0}]}
IMAGE = "r/x@sha256:" + "0" * 64


def verifier_tar(detail: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = json.dumps(detail).encode()
        info = tarfile.TarInfo("verifier/reward_detail.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("binarize", [False, True])
def test_general_agent_regrade_re_asks_the_judge(tmp_path, binarize):
    task = Task("ga", {"kind": "general_agent", "image": IMAGE, "instance_id": "ga"})
    env = GeneralEnvironment(ServiceContext("general", str(tmp_path), {"binarize": binarize}),
                             [task])
    with FakeJudge() as fake:
        env.judge = Judge(JudgeConfig.from_env("GA_JUDGE", {
            "GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "m", "GA_JUDGE_KEY": "k"},
            attempts=1, timeout_s=2))
        env.client = types.SimpleNamespace(get_archive=lambda cid, path: verifier_tar(DETAIL))
        episode = env.create_episode(task, seed=None, episode_id="e")
        episode.container = types.SimpleNamespace(id="c" * 12)
        episode.pending_judge = True
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
