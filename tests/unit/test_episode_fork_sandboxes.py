"""Coding's and AutoResearch's Episode.fork against a fake helper: what the
child carries, what it must not, and how the helper's ForkSandbox refusals
become NotForkable (the real verb: tests/privileged/test_fork_sandboxes.py)."""

from __future__ import annotations

import types

import pytest

from camg import errors


class FakeHelper:
    def __init__(self, refusal: errors.CamgError | None = None) -> None:
        self.refusal = refusal
        self.forked: list[str] = []

    def fork_sandbox(self, sandbox_id: str) -> dict:
        if self.refusal is not None:
            raise self.refusal
        self.forked.append(sandbox_id)
        return {"sandbox_id": f"child-of-{sandbox_id}", "depth": 1, "upper_bytes": 1 << 20}

    def list_sandboxes(self) -> list[dict]:
        return []


def coding(helper):
    from environments.coding.episode import CodingEpisode
    from environments.coding.settings import Settings
    prepared = types.SimpleNamespace(row=types.SimpleNamespace(instance_id="t1"),
                                     image=types.SimpleNamespace(env=()))
    episode = CodingEpisode(Settings(mirrors_root="/m", images="/i"), helper, prepared, "parent")
    episode.sandbox, episode.steps = "sb-parent", 3
    return episode


def research(helper, ledger=None):
    from environments.autoresearch.episode import Prepared, ResearchEpisode
    from environments.autoresearch.settings import Settings
    settings = Settings(packages_root="/p", workspaces_root="/w", private_root="/x", images="/i")
    episode = ResearchEpisode(settings, helper, None,
                              Prepared("t1", "x", "/w", types.SimpleNamespace(env=())),
                              "parent", ledger)
    episode.sandbox, episode.steps, episode.jobs, episode.started = "sb-parent", 4, 2, 123.5
    return episode


class Ledger:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add_sandbox(self, sandbox_id: str) -> None:
        self.added.append(sandbox_id)


def test_coding_child_carries_task_and_steps_not_a_grade():
    helper = FakeHelper()
    parent = coding(helper)
    parent.diff, parent.usage = b"stale", {"cpu_s": 9.0}  # never the child's
    child = parent.fork("child")
    assert helper.forked == ["sb-parent"]
    assert (child.episode_id, child.sandbox, child.steps) == ("child", "child-of-sb-parent", 3)
    assert child.task is parent.task and child.terminal is None
    assert child.diff is None and child.report is None and child.usage is None
    assert parent.sandbox == "sb-parent" and parent.steps == 3


def test_research_child_carries_counts_and_clock_not_evidence():
    ledger = Ledger()
    parent = research(FakeHelper(), ledger)
    parent.evidence = ["submission_link: x"]
    child = parent.fork("child")
    assert (child.steps, child.jobs, child.started) == (4, 2, 123.5)
    assert child.sandbox == "child-of-sb-parent" and ledger.added == ["child-of-sb-parent"]
    assert child.evidence == [] and child.submitted is None and child.report is None


@pytest.mark.parametrize("make, helper_error, cls, what", [
    (coding, "not_allowed", errors.PermissionDenied, "processes"),
    (coding, "limit_exceeded", errors.BadRequest, "fork_depth"),
    (research, "not_allowed", errors.PermissionDenied, "background_jobs"),
    (research, "limit_exceeded", errors.BadRequest, "fork_depth"),
])
def test_named_refusals_are_not_forkable(make, helper_error, cls, what):
    parent = make(FakeHelper(cls("helper: refused", helper_error=helper_error)))
    with pytest.raises(errors.NotForkable) as refused:
        parent.fork("child")
    assert refused.value.details["what"] == what
    assert refused.value.to_dict()["error"] == "not_forkable"


@pytest.mark.parametrize("make", [coding, research])
def test_other_helper_errors_are_the_childs_failure(make):
    # a full helper or a vanished parent: an infrastructure failure, never a refusal
    with pytest.raises(errors.InfraFailure):
        make(FakeHelper(errors.AtCapacity("helper: full", helper_error="at_capacity"))).fork("c")
    with pytest.raises(errors.SandboxDied):
        make(FakeHelper(errors.NotFound("helper: gone", helper_error="not_found"))).fork("c")


@pytest.mark.parametrize("make", [coding, research])
def test_finished_or_closed_episodes_do_not_fork(make):
    parent = make(FakeHelper())
    parent.terminal = object()
    with pytest.raises(errors.NotForkable):
        parent.fork("c")
    parent = make(FakeHelper())
    parent._closed = True
    with pytest.raises(errors.SandboxDied):
        parent.fork("c")
