"""Visual regrade: the stored screenshot before the judge again (a new judge
call) gives the episode's reward with the scripted judge; a screenshot that
is gone or changed is no_submission, a judge failure judge_error."""

from __future__ import annotations

import pytest

from camg import errors
from tests.support.fake_judge import Reply
# The Visual unit rig: a directory as the task container, Pillow as the renderer.
from tests.unit.test_visual_environment import REFERENCE, judge, make_env, run  # noqa: F401


def test_regrade_re_asks_the_judge_and_gives_the_same_reward(tmp_path, judge, monkeypatch):  # noqa: F811
    env, task, _ = make_env(tmp_path, judge, monkeypatch)
    ep, _, _ = run(env, task, [{"operation": "shell", "command": REFERENCE},
                               {"operation": "finish"}], "ref")
    reward = ep.grade()
    submission = ep.submission()
    assert submission.data == b"" and submission.meta["screenshot"] == "ref.jpg"
    asked = len(judge.requests)
    grade = env.regrade(task, submission)
    assert grade.reward == reward and len(judge.requests) == asked + 1
    assert grade.outcome["judge"]["rubric"]["score"] == reward
    assert grade.outcome["rubric_hash"] == ep.outcome()["rubric_hash"]

    judge.script(Reply(status=500), Reply(status=500))
    with pytest.raises(errors.JudgeError):
        env.regrade(task, submission)
    (env.shots_dir / "ref.jpg").write_bytes(b"\xff\xd8 changed")
    with pytest.raises(errors.NoSubmission):
        env.regrade(task, submission)


def test_regrade_asks_the_same_address_question(tmp_path, judge, monkeypatch):  # noqa: F811
    """The page text the address question was asked about is the stored
    submission: a regrade asks it again, word for word (same prompt hash),
    and finds the same address."""
    import dataclasses

    from tests.unit.test_visual_environment import PARAPHRASE, Texted

    env, task, _ = make_env(tmp_path, judge, monkeypatch, renderer=Texted("Crumb\n" + PARAPHRASE))
    ep, _, _ = run(env, task, [{"operation": "shell", "command": REFERENCE},
                               {"operation": "finish"}], "para")
    assert ep.grade() == 0.0
    asked = ep.outcome()["judge_address"]["judge_prompt_hash"]
    submission = ep.submission()
    # even a record whose verdict said ok (an older rule set) is regraded by the question
    as_ok = dataclasses.replace(submission, meta={**submission.meta, "integrity": "ok"})
    grade = env.regrade(task, as_ok)
    assert grade.reward == 0.0 and grade.outcome["integrity"] == "tampered"
    assert grade.outcome["judge_address"]["judge_prompt_hash"] == asked
    assert grade.outcome["integrity_evidence"][0].startswith("judge_addressed_model: ")
    assert "judge" not in grade.outcome
