"""AutoResearch without root: metrics, submission parsing, normalisation, the
grader's authenticated wire (the real grader loop on a socketpair), settings,
the run ledger's refusal of an unchecked state directory, and the helper's
deny-list path checks."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from camg import errors
from environments.autoresearch import gradewire, grader, metrics, runstate
from environments.autoresearch.environment import load_settings


# -- metrics -------------------------------------------------------------------

def test_roc_auc_matches_pairwise_definition_with_ties():
    rng = np.random.RandomState(0)
    truth = rng.randint(0, 2, 200)
    scores = np.round(rng.rand(200), 1)  # many ties
    pos, neg = scores[truth == 1], scores[truth == 0]
    pairwise = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert metrics.roc_auc(truth, scores) == pytest.approx(pairwise)
    from sklearn.metrics import roc_auc_score
    assert metrics.roc_auc(truth, scores) == pytest.approx(roc_auc_score(truth, scores))


def test_accuracy_mae_dice():
    assert metrics.accuracy(np.array([1, 2, 3]), np.array([1, 2, 4])) == pytest.approx(2 / 3)
    assert metrics.mae(np.array([1.0, 2.0]), np.array([2.0, 4.0])) == 1.5
    assert metrics.dice(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0])) == pytest.approx(2 / 3)
    assert metrics.dice(np.zeros(4), np.zeros(4)) == 1.0


@pytest.mark.parametrize("value,baseline,reference,expected", [
    (0.9, 0.8, 1.0, 0.5), (0.7, 0.8, 1.0, 0.0), (1.2, 0.8, 1.0, 1.0),
    (50.0, 60.0, 40.0, 0.5), (70.0, 60.0, 40.0, 0.0), (30.0, 60.0, 40.0, 1.0)])
def test_normalise_both_directions_clipped(value, baseline, reference, expected):
    assert metrics.normalise(value, baseline, reference) == pytest.approx(expected)



def test_normalise_takes_floating_point_noise_at_either_end_as_that_end():
    # the reference's score from the host's numpy, the oracle's from the
    # image's: an MAE 4 ulps off the reference is the reference (exactly 1.0)
    reference, baseline = 43.91000000000001, 62.3
    assert metrics.normalise(reference * (1 + 4e-16), baseline, reference) == 1.0
    assert metrics.normalise(baseline * (1 - 4e-16), baseline, reference) == 0.0
    # a real step is still a fraction, however close to the end
    assert metrics.normalise(reference + 1e-6 * (baseline - reference), baseline, reference) < 1.0
    assert 0.0 < metrics.normalise(baseline - 1e-6 * (baseline - reference), baseline, reference)

@pytest.mark.parametrize("data,problem,rule", [
    (b"", "header", "header"), (b"\xff\xfe", "UTF-8", "encoding"),
    (b"id,pred\na,1\n", "header", "header"),
    (b"id,prediction\na,1\n", "1 of the 2", "partial"),
    (b"id,prediction\na,1\na,2\nb,1\n", "twice", "duplicate_id"),
    (b"id,prediction\na,1\nz,1\n", "unknown id", "unknown_id"),
    (b"id,prediction\na,nan\nb,1\n", "finite", "not_finite"),
    (b"id,prediction\na,inf\nb,1\n", "finite", "not_finite"),
    (b"id,prediction\na,x\nb,1\n", "not a number", "not_number"),
    (b"id,prediction\na,1,2\nb,1\n", "2 fields", "fields"),
    (b"id,prediction\n" + b"a,1\n" * (5 << 20), "larger", "size"),
    # text the csv module raises on: a malformed submission, never a grader error
    (b"id,prediction\na," + b"1" * 200_000 + b"\nb,1\n", "not CSV", "csv"),
    (b"id,prediction\na,1\rx\nb,1\n", "2 fields", "fields"),
])
def test_malformed_submissions_are_invalid(data, problem, rule):
    with pytest.raises(metrics.SubmissionInvalid, match=problem) as caught:
        metrics.parse_submission(data, ["a", "b"])
    assert caught.value.rule == rule


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_any_line_ending_parses(newline):
    data = newline.join([b"id,prediction", b"a,1", b"b,2", b""])
    assert metrics.parse_submission(data, ["a", "b"]).tolist() == [1.0, 2.0]


def test_verdict_tampered_on_evidence_or_unknown_ids_and_reward_zero():
    from environments.autoresearch.episode import graded

    def grade(task_id, data):
        if b"zz" in data:
            return {"valid": False, "reward": 0.0, "detail": "line 2: unknown id 'zz'",
                    "rule": "unknown_id"}
        return {"valid": True, "reward": 1.0, "score": 1.0, "detail": ""}

    reward, report = graded(grade, "t", b"good")
    assert (reward, report.integrity, report.evidence) == (1.0, "ok", [])
    reward, report = graded(grade, "t", b"good", ["submission_written_at_finish: x"])
    assert (reward, report.integrity) == (0.0, "tampered")
    assert report.evidence == ["submission_written_at_finish: x"]
    reward, report = graded(grade, "t", b"zz")
    assert (reward, report.integrity) == (0.0, "tampered")
    assert report.evidence == ["submission_unknown_id: line 2: unknown id 'zz'"]
    reward, report = graded(grade, "t", None, ["submission_link: /workspace/submission.csv -> x"])
    assert (reward, report.integrity, report.submitted) == (0.0, "tampered", False)
    reward, report = graded(grade, "t", None)
    assert (reward, report.integrity) == (0.0, "ok")


def test_integer_metric_refuses_fractions_and_order_is_by_id():
    with pytest.raises(metrics.SubmissionInvalid, match="integer"):
        metrics.parse_submission(b"id,prediction\na,1.5\nb,1\n", ["a", "b"], integer=True)
    got = metrics.parse_submission(b"id,prediction\nb,2\na,1\n", ["a", "b"], integer=True)
    assert got.tolist() == [1.0, 2.0]


class _CollectHelper:
    """The helper as the finish sees it, recording the order of its calls.
    The submission on "disk" changes the moment any command runs while an
    agent process is alive: a job that writes once it sees the collection."""

    def __init__(self, state: str = "regular file|4", data: bytes = b"good") -> None:
        self.calls: list[str] = []
        self.alive, self.state, self.data = True, state, data

    def kill_commands(self, sandbox: str) -> int:
        self.calls.append("kill")
        self.alive = False
        return 3

    def exec(self, sandbox: str, command: str, **kw):
        import types
        self.calls.append(f"exec as {kw['user']}")
        if self.alive:  # the job's late write
            self.state, self.data = "regular file|5", b"late!"
        return types.SimpleNamespace(output=f"state={self.state}\n", exit_code=0,
                                     timed_out=False)

    def get_archive(self, sandbox: str, path: str) -> bytes:
        import io
        import tarfile
        self.calls.append("archive")
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            info = tarfile.TarInfo("submission.csv")
            info.size = len(self.data)
            tar.addfile(info, io.BytesIO(self.data))
        return out.getvalue()

    def list_sandboxes(self) -> list[dict]:
        return []


def _research_episode(helper):
    import types
    from environments.autoresearch.episode import Prepared, ResearchEpisode
    from environments.autoresearch.settings import Settings
    settings = Settings(packages_root="/p", workspaces_root="/w", private_root="/x", images="/i")
    episode = ResearchEpisode(settings, helper, None,
                              Prepared("t1", "x", "/w", types.SimpleNamespace(env=())), "e")
    episode.sandbox = "sb"
    return episode


def test_the_finish_kills_every_agent_process_from_outside_before_anything_runs():
    """Nothing of the collection runs in the sandbox while an agent process
    is alive, so no job can see it begin and write after the episode ended:
    the helper's kill comes first, then one root command reads the state,
    then the copy."""
    helper = _CollectHelper()
    submitted, problem, evidence = _research_episode(helper)._collect("sb")
    assert helper.calls == ["kill", "exec as root", "archive"]
    assert (submitted, problem, evidence) == (b"good", "", [])


@pytest.mark.parametrize("state, rule", [
    ("link /task/test.csv", "submission_link: /workspace/submission.csv -> /task/test.csv"),
    ("fifo|0", "submission_not_regular: /workspace/submission.csv is a fifo"),
    ("directory|4096", "submission_not_regular: /workspace/submission.csv is a directory"),
])
def test_the_finish_reads_a_link_or_special_file_as_tampering_without_copying(state, rule):
    helper = _CollectHelper(state)
    submitted, _, evidence = _research_episode(helper)._collect("sb")
    assert submitted is None and evidence == [rule]
    assert helper.calls == ["kill", "exec as root"]


def test_the_finish_takes_a_missing_or_oversized_file_as_nothing_submitted():
    for state in ("missing", f"regular file|{(8 << 20) + 1}"):
        helper = _CollectHelper(state)
        submitted, problem, evidence = _research_episode(helper)._collect("sb")
        assert (submitted, evidence) == (None, []) and problem
        assert helper.calls == ["kill", "exec as root"]


def test_a_probe_that_fails_with_no_agent_process_left_is_the_infrastructures():
    helper = _CollectHelper("")
    helper.exec = lambda *a, **kw: __import__("types").SimpleNamespace(
        output="", exit_code=137, timed_out=True)
    with pytest.raises(errors.InfraFailure, match="submission probe failed"):
        _research_episode(helper)._collect("sb")


def test_a_command_the_sandbox_cannot_start_is_told_apart_from_infrastructure():
    from environments.autoresearch.episode import _not_started
    full = errors.InfraFailure("helper: init could not start the command: Resource "
                               "temporarily unavailable", helper_error="internal")
    assert _not_started(full)
    assert not _not_started(errors.InfraFailure("helper: connection refused"))
    assert not _not_started(errors.SandboxDied("sandbox x died: init could not start the command"))


def test_canaries_fail_on_a_null_reward_unless_not_set_up():
    from environments.autoresearch.checks.canaries import null_rewards
    from devtools.canary_table import CanaryResult
    rows = [CanaryResult("masked", None, None, 0.0, "infrastructure: the probe failed"),
            CanaryResult("unset", None, None, 0.0, "canary not set up: the writer never wrote"),
            CanaryResult("zero", 0.0, "ok", 0.0, "")]
    assert [line.split(":")[0] for line in null_rewards(rows)] == ["masked"]


# -- the grader's loop over its authenticated wire -------------------------------

@pytest.fixture
def private(tmp_path: Path) -> Path:
    task = tmp_path / "t1"
    task.mkdir()
    (task / "answers.csv").write_text("id,target\na,1\nb,0\nc,1\nd,0\n")
    (task / "scoring.json").write_text(json.dumps(
        {"metric": "roc_auc", "baseline_score": 0.5, "reference_score": 1.0}))
    return tmp_path


@pytest.fixture
def grader_loop(private):
    ours, theirs = socket.socketpair()
    credential = b"k" * 32
    tasks = {"t1": grader._load(str(private), "t1")}
    thread = threading.Thread(target=grader.serve, args=(theirs, credential, tasks), daemon=True)
    thread.start()
    hello, _ = gradewire.receive(ours, credential, gradewire.FROM_GRADER, 0)
    yield ours, credential, hello
    ours.close()
    thread.join(5)
    theirs.close()
    assert not thread.is_alive(), "the grader must exit when the service closes its end"


def _ask(sock, credential, seq, task_id, blob):
    gradewire.send(sock, credential, gradewire.TO_GRADER, seq, {"task_id": task_id}, blob)
    return gradewire.receive(sock, credential, gradewire.FROM_GRADER, seq)[0]


def test_grader_scores_normalises_and_reports_answers_hash(grader_loop, private):
    sock, credential, hello = grader_loop
    from environments.autoresearch.prepare import answers_hash
    assert hello["hello"] and hello["answers"] == {"t1": answers_hash(private / "t1")}
    perfect = _ask(sock, credential, 1, "t1", b"id,prediction\na,0.9\nb,0.1\nc,0.8\nd,0.2\n")
    assert perfect["ok"] and perfect["valid"] and perfect["reward"] == 1.0
    random = _ask(sock, credential, 2, "t1", b"id,prediction\na,0.5\nb,0.5\nc,0.5\nd,0.5\n")
    assert random["reward"] == 0.0 and random["score"] == 0.5
    bad = _ask(sock, credential, 3, "t1", b"garbage")
    assert bad["ok"] and not bad["valid"] and bad["reward"] == 0.0
    # csv.Error once escaped as ok: false, i.e. grader_error and reward null
    huge = _ask(sock, credential, 4, "t1", b"id,prediction\na," + b"1" * 200_000 + b"\n")
    assert huge["ok"] and not huge["valid"] and huge["reward"] == 0.0 and huge["rule"] == "csv"
    unknown = _ask(sock, credential, 5, "nope", b"")
    assert not unknown["ok"]


def test_grader_refuses_a_forged_request(private):
    ours, theirs = socket.socketpair()
    tasks = {"t1": grader._load(str(private), "t1")}
    result = {}

    def run():
        try:
            grader.serve(theirs, b"k" * 32, tasks)
        except gradewire.Tampered as exc:
            result["tampered"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    gradewire.receive(ours, b"k" * 32, gradewire.FROM_GRADER, 0)
    gradewire.send(ours, b"x" * 32, gradewire.TO_GRADER, 1, {"task_id": "t1"}, b"")
    thread.join(5)
    assert "tampered" in result
    ours.close()
    theirs.close()


def test_replies_are_authenticated_too():
    a, b = socket.socketpair()
    gradewire.send(a, b"k" * 32, gradewire.FROM_GRADER, 1, {"ok": True, "reward": 1.0})
    with pytest.raises(gradewire.Tampered):
        gradewire.receive(b, b"k" * 32, gradewire.FROM_GRADER, 2)  # replayed/out of order
    a.close()
    b.close()


# -- settings, ledger -----------------------------------------------------------

BASE = {"packages_root": "/srv/p", "workspaces_root": "/srv/w", "private_root": "/srv/x",
        "images": "/srv/i.json"}


@pytest.mark.parametrize("change,problem", [
    ({"private_root": "/srv/w/x"}, "separate"), ({"private_root": "/srv/w"}, "differ"),
    ({"images": "rel.json"}, "absolute"), ({"command_minutes": 0}, "positive"),
    ({"credential": "x"}, "credential"), ({"disk_bytes": 0}, "positive")])
def test_settings_refused(change, problem):
    with pytest.raises(errors.ConfigError, match=problem):
        load_settings({**BASE, **change})


def test_unchecked_state_dir_refused_naming_check_clean(tmp_path):
    ledger = runstate.RunLedger(str(tmp_path), "autoresearch", "/nonexistent.sock")
    with pytest.raises(errors.ConfigError, match="--check-clean"):
        ledger.claim("prepared/autoresearch.json")
    ok, notes = runstate.check_clean(str(tmp_path), helper_socket="/nonexistent.sock",
                                     owner="autoresearch")
    assert ok, notes
    ledger.claim("prepared/autoresearch.json")
    assert not (tmp_path / "clean.json").exists() and (tmp_path / "run.json").exists()
    # A second service on the same directory is refused: the mark was consumed.
    with pytest.raises(errors.ConfigError, match="--check-clean"):
        runstate.RunLedger(str(tmp_path), "autoresearch", "/x").claim("c.json")


def test_check_clean_refuses_while_the_run_lives_or_its_sandboxes_cannot_be_released(tmp_path):
    import subprocess
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run.json").write_text(json.dumps(
            {"pid": sleeper.pid, "grader_pid": None, "sandboxes": [], "owner": "autoresearch"}))
        ok, notes = runstate.check_clean(str(tmp_path), helper_socket="/x", owner="a")
        assert not ok and "still running" in notes[0]
    finally:
        sleeper.kill()
        sleeper.wait()
    (tmp_path / "run.json").write_text(json.dumps(
        {"pid": 0, "grader_pid": None, "sandboxes": ["abc"], "owner": "autoresearch",
         "helper_socket": str(tmp_path / "missing.sock")}))
    ok, notes = runstate.check_clean(str(tmp_path), helper_socket="/x", owner="a")
    assert not ok and "abc" in notes[0]
    assert not (tmp_path / "clean.json").exists()


# -- the helper's deny-list, by path (the mount cases are privileged tests) -------

def test_private_roots_refused_by_path(tmp_path):
    from camg.helper_wire import WireError
    from helper import paths
    lowers = tmp_path / "lowers"
    (lowers / "ok").mkdir(parents=True)
    (lowers / "answers" / "t").mkdir(parents=True)
    private = (str(lowers / "answers"),)
    assert paths.resolve_lower(str(lowers / "ok"), (str(lowers),), private)
    for target in (lowers / "answers", lowers / "answers" / "t"):
        with pytest.raises(WireError) as info:
            paths.resolve_lower(str(target), (str(lowers),), private)
        assert info.value.name == "path_escape"
    with pytest.raises(ValueError, match="overlaps"):
        paths.probe_private_roots((str(lowers),), private, ())


def test_helper_config_refuses_overlapping_private_root(tmp_path):
    from helper import config
    path = tmp_path / "helper.json"
    path.write_text(json.dumps({"lower_roots": [str(tmp_path / "l")],
                                "upper_root": str(tmp_path / "private" / "u"),
                                "private_roots": [str(tmp_path / "private")]}))
    with pytest.raises(config.ConfigError, match="private_roots"):
        config.load(str(path))


# -- camg.serve --check-clean delegates to the environment ------------------------

def test_check_clean_is_a_no_op_for_environments_without_run_state(tmp_path):
    import os
    import subprocess
    import sys
    from tests.support.services import REPO, configure_counter
    config = configure_counter(tmp_path)
    result = subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(config),
                             "--check-clean"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert result.returncode == 0 and "nothing to check" in result.stdout
