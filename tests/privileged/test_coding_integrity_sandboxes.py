"""Tamper resistance and no silent zeros, graded in real grader sandboxes on the demo image.

Each canary of environments/coding/checks/canaries.py is applied to a copy of a task's
agent layer, the agent diff is taken with the service's command, and the
episode grades it exactly as the service does (fresh grader sandbox over
[image, grader layer], the root-owned guard plugin, swebench's parse, the
cross-check). Every technique earns 0.0 alone and next to the gold fix,
with integrity "tampered"; a runner that cannot start is a GraderError;
an agent that breaks the package's imports earns an honest 0.0.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from camg import errors
from environments.coding import diff_paths, layers
from environments.coding.checks import canaries
from test_coding_episodes import CACHE, env, prepared  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def workspace_diff(env, task, edit) -> bytes:
    """Apply ``edit(work)`` to a copy of the task's agent layer; the agent diff."""
    built = env.prepared[task.task_id].layers
    tmp = Path(tempfile.mkdtemp(prefix="camg-canary-"))
    try:
        subprocess.run(["cp", "-a", built.agent, str(tmp / "agent")], check=True)
        work = tmp / "agent" / "testbed"
        edit(work)
        cmd = diff_paths.diff_command(built.snapshot, private_git=str(tmp / "agent" / layers.PRIVATE_GIT),
                                   workdir=str(work))
        return subprocess.run(["bash", "-c", cmd], capture_output=True, check=True).stdout
    finally:
        shutil.rmtree(tmp)


def grade(env, task, diff: bytes, episode_id: str, **prepared_changes):
    episode = env.create_episode(task, seed=None, episode_id=episode_id)
    if prepared_changes:
        episode.task = dataclasses.replace(episode.task, **prepared_changes)
    episode.diff = diff
    try:
        reward = episode.grade()
        return reward, episode.report, episode.outcome()
    finally:
        episode.close()


def reverse_gold(task):
    def edit(work):
        subprocess.run(["git", "apply", "-R", "-"], input=task.data["patch"].encode(), cwd=work,
                       check=True)
    return edit


@pytest.mark.parametrize("with_gold", [False, True], ids=["alone", "with_gold"])
@pytest.mark.parametrize("technique", sorted(canaries.TECHNIQUES))
def test_canary_earns_zero_in_the_grader_sandbox(env, technique, with_gold):
    task = env.tasks[0]
    row = env.prepared[task.task_id].row

    def edit(work):
        if with_gold:
            reverse_gold(task)(work)
        canaries.apply(technique, work, row, package="apispec")
    reward, report, outcome = grade(env, task, workspace_diff(env, task, edit),
                                    f"canary-{technique}-{with_gold}")
    assert reward == 0.0, (technique, report)
    assert outcome["integrity"] == "tampered" and outcome["integrity_evidence"], outcome


# The demo profile starts pytest through its entry script, which does not put
# /testbed on sys.path first: a top-level pytest.py there is inert (the gold
# fix under it honestly earns 1.0 when the screen is off). `python -m pytest`
# commands are covered by the unit suite.
_INERT_HERE = {"shadow_pytest_module"}


@pytest.mark.parametrize("technique", sorted(t for t, v in canaries.TECHNIQUES.items()
                                             if v.runtime_rule and t not in _INERT_HERE))
def test_guard_alone_catches_the_canary_in_the_sandbox(env, technique, monkeypatch):
    from environments.coding import integrity
    monkeypatch.setattr(integrity, "screen", lambda diff: [])
    task = env.tasks[0]
    row = env.prepared[task.task_id].row

    def edit(work):
        reverse_gold(task)(work)
        canaries.apply(technique, work, row, package="apispec")
    reward, report, _ = grade(env, task, workspace_diff(env, task, edit), f"guard-{technique}")
    assert reward == 0.0, (technique, report)
    assert canaries.TECHNIQUES[technique].runtime_rule in {e["rule"] for e in report.evidence}


def test_gold_alone_is_one_and_clean(env):
    """The control of the canaries above (all on tasks[0]): the same diff
    path without a canary is 1.0 and clean. Every task's gold fix is 1.0 and
    "ok" through real episodes in test_coding_episodes.py."""
    task = env.tasks[0]
    reward, report, outcome = grade(env, task, workspace_diff(env, task, reverse_gold(task)),
                                    f"gold-{task.task_id[-8:]}")
    assert reward == 1.0 and outcome["integrity"] == "ok", (task.task_id, report)


def test_missing_runner_is_grader_error(env):
    task = env.tasks[0]
    base = env.prepared[task.task_id].profile
    from environments.coding import episode as episode_mod
    prepared_task = env.prepared[task.task_id]
    for broken in (base.test_cmd.replace("pytest ", "no-such-pytest ", 1),
                   "/opt/no-such-env/bin/python -m pytest --verbose"):
        profile = dataclasses.replace(base, test_cmd=broken)
        # First grade: the up-front probe; later grades: the run that never
        # started, then the probe on the pristine tree.
        for probed_before in (False, True):
            if probed_before:
                episode_mod._PROBED.add((prepared_task.image.hash, prepared_task.layers.grader,
                                         broken))
            with pytest.raises(errors.GraderError, match="cannot start") as info:
                grade(env, task, workspace_diff(env, task, reverse_gold(task)), "no-runner",
                      profile=profile)
            assert info.value.failure_class is errors.FailureClass.GRADER_ERROR


def test_runner_that_collects_none_of_the_tests_is_grader_error(env):
    task = env.tasks[0]
    base = env.prepared[task.task_id].profile
    profile = dataclasses.replace(base, test_cmd=base.test_cmd + " -k camg_no_such_test")
    with pytest.raises(errors.GraderError, match="collects none"):
        grade(env, task, b"", "blind-runner", profile=profile)


def test_agent_breaking_the_package_earns_zero(env):
    task = env.tasks[0]

    def edit(work):
        reverse_gold(task)(work)
        init = work / "src" / "apispec" / "__init__.py"
        init.write_text(init.read_text() + "\nraise ImportError('broken by the agent')\n")
    reward, report, outcome = grade(env, task, workspace_diff(env, task, edit), "broken")
    assert reward == 0.0 and outcome["integrity"] == "ok", report
    assert report.none_collected


def test_validate_refuses_planted_bad_tasks_and_records_good_ones(demo_set, prepared,
                                                                  coding_helper, tmp_path):
    """camg.prepare --validate: gold and no-op graded in sandboxes; a task whose
    gold cannot pass (a FAIL_TO_PASS test that does not exist) and one whose
    no-op already passes (a passing test planted in FAIL_TO_PASS) are refused
    by name; the good tasks' results are recorded in the manifest."""
    import json
    from camg.config import task_manifest as manifest
    from camg.prepare import main

    rows = [json.loads(line) for line in (demo_set / "tasks.jsonl").read_text().splitlines()]
    good = rows[:2]
    bad_gold = dict(rows[2], FAIL_TO_PASS=rows[2]["FAIL_TO_PASS"]
                    + ["tests/test_core.py::test_camg_planted_missing"])
    bad_noop = dict(rows[3], FAIL_TO_PASS=[rows[3]["PASS_TO_PASS"][0]],
                    PASS_TO_PASS=rows[3]["PASS_TO_PASS"][1:])
    planted = tmp_path / "rows.jsonl"
    planted.write_text("".join(json.dumps(r) + "\n" for r in [*good, bad_gold, bad_noop]))
    common = ["--environment", "coding", "--mirrors-root", str(demo_set / "mirrors"),
              "--images", str(prepared["images"]), "--layers-root", str(CACHE / "layers"),
              "--helper-socket", coding_helper.socket, "--validate"]
    out = tmp_path / "manifest.json"
    import io
    import contextlib
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*common, "--rows", str(planted), "--output", str(out)]) == 2
    message = err.getvalue()
    assert "refused 2 of 4" in message, message
    assert bad_gold["instance_id"] in message and bad_noop["instance_id"] in message
    assert good[0]["instance_id"] not in message and not out.exists()

    fine = tmp_path / "good.jsonl"
    fine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*common, "--rows", str(fine), "--output", str(out), "--sample", "2",
                 "--seed", "3"]) == 0
    body = manifest.load(out)
    validation = body.sampling["validation"]
    assert validation["validated"] == 2 and validation["of"] == len(rows)
    assert all(r == {"gold": 1.0, "noop": 0.0} for r in validation["results"].values())


def test_agent_view_leaks_nothing_of_the_fix(env):
    """The history/leak check of the canary suite (environments.coding.checks.canaries.view_leaks)
    on every demo task: no bytecode, copy, archive or git object of the clean
    sources is readable by the agent."""
    leaked = {}
    for task in env.tasks:
        episode = env.create_episode(task, seed=None, episode_id=f"view-{task.task_id[-8:]}")
        try:
            episode.reset()
            leaked[task.task_id] = canaries.view_leaks(episode)
        finally:
            episode.close()
    assert leaked and not any(leaked.values()), {k: v for k, v in leaked.items() if v}


# -- A null is a claim the service proves ------------------------------------
# environments/coding/checks/canaries.py's OBSTRUCTIONS: ways an agent could make its own
# episode end with reward null (masked by the trainer). Played as the service
# plays them: the finish's failure or the grade's goes to the episode's
# control (camg.episodes.null_proof), which reruns the same path on fresh sandboxes of
# the pristine image; it succeeding makes the episode 0.0 "obstructed".

def proved(episode, exc, phase):
    """camg.episodes.null_proof's verdict on ``exc`` from ``phase``: (0.0, "obstructed",
    evidence) when the control succeeds, else (None, failure class, why)."""
    failure = getattr(exc, "failure_class", errors.FailureClass.INFRA).value
    try:
        evidence = episode.control(exc, phase)
    except Exception as control_exc:  # noqa: BLE001 - the control failed: the null stands
        return None, failure, [str(exc), f"control: {control_exc}"]
    if evidence is None:
        return None, failure, [str(exc), "no control"]
    return 0.0, "obstructed", [str(exc), *evidence]


def play(env, task, episode_id, *, actions=(), diff=None, **settings):
    """An episode through its finish (``actions`` then finish) or, given a
    ``diff``, its grade alone, failures proved: (reward, integrity or failure
    class, evidence)."""
    episode = env.create_episode(task, seed=None, episode_id=episode_id)
    if settings:
        episode.settings = dataclasses.replace(episode.settings, **settings)
    try:
        if diff is None:
            episode.reset()
            for action in [*actions, {"operation": "finish"}]:
                try:
                    step = episode.step(action)
                except Exception as exc:  # noqa: BLE001 - the manager proves any failure
                    return proved(episode, exc, "step")
                if step.done:
                    break
        else:
            episode.diff = diff
        try:
            reward = episode.grade()
        except Exception as exc:  # noqa: BLE001 - the manager proves any failure
            return proved(episode, exc, "grade")
        outcome = episode.outcome()
        return reward, outcome.get("integrity"), outcome.get("integrity_evidence", [])
    finally:
        episode.close()


def gold_action(task):
    return {"operation": "shell",
            "command": f"git apply -R - <<'CAMG_EOF'\n{task.data['patch']}\nCAMG_EOF"}


@pytest.mark.parametrize("with_gold", [False, True], ids=["alone", "with_gold"])
@pytest.mark.parametrize("name", sorted(canaries.OBSTRUCTIONS))
def test_obstruction_earns_zero_never_null(env, name, with_gold):
    task = env.tasks[0]
    row = env.prepared[task.task_id].row
    technique = canaries.OBSTRUCTIONS[name]
    settings = {"grade_timeout": technique.grade_timeout} if technique.grade_timeout else {}
    if technique.phase == "grade":
        def edit(work):
            if with_gold:
                reverse_gold(task)(work)
            technique.edit(work, row, "apispec")
        got = play(env, task, f"null-{name}-{with_gold}", diff=workspace_diff(env, task, edit),
                   **settings)
    else:
        actions = [*([gold_action(task)] if with_gold else []),
                   *({"operation": "shell", "command": c} for c in technique.commands)]
        got = play(env, task, f"null-{name}-{with_gold}", actions=actions, **settings)
    reward, verdict, evidence = got
    assert reward is not None, (name, verdict, evidence)
    assert reward in (technique.with_gold if with_gold else {0.0}), got
    assert verdict in ("ok", "tampered", "obstructed"), got
    if verdict == "obstructed":
        assert any(line.startswith("control: ") for line in evidence), got


def test_scratch_taken_in_the_grader_is_a_plain_zero(env):
    """The follow-up collection check runs in a fresh grader sandbox, so a
    scratch directory the agent's code took in the graded run's sandbox
    changes nothing: the pristine tree collects the tests, the agent broke
    collection, 0.0 with integrity ok (no control needed)."""
    task = env.tasks[0]
    row = env.prepared[task.task_id].row
    diff = workspace_diff(env, task, lambda work: canaries.grader_scratch_unwritable(
        work, row, "apispec"))
    got = play(env, task, "scratch", diff=diff)
    assert got[:2] == (0.0, "ok"), got


def test_pids_filled_at_finish_is_killed_before_the_diff(env, coding_helper):
    """The fork loop the agent left is killed from outside (KillCommands)
    before the diff is taken: the finish succeeds and nothing is proved."""
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="pids-finish")
    try:
        episode.reset()
        episode.step(gold_action(task))
        episode.step({"operation": "shell", "command": canaries._FORK_LOOP})
        assert episode.step({"operation": "finish"}).done
        assert episode.diff and episode.grade() == 1.0
    finally:
        episode.close()


def test_regrade_of_an_obstructing_diff_is_obstructed(env):
    """The regrade path proves its failure as the episode's grade did."""
    from camg.environment import Submission
    task = env.tasks[0]
    row = env.prepared[task.task_id].row
    diff = workspace_diff(env, task, lambda work: canaries.kill_every_process_of_the_test_uid(
        work, row, "apispec"))
    graded = env.regrade(task, Submission(diff, {}))
    assert graded.reward == 0.0 and graded.outcome["integrity"] == "obstructed", graded
    assert any(line.startswith("control: ") for line in graded.outcome["integrity_evidence"])


def test_helper_gone_while_episodes_finish_stays_null(prepared, demo_image, rootfs):  # noqa: F811
    """An honest infrastructure failure stays distinguishable: the helper
    killed while one episode is about to be graded and another to finish.
    Both fail, both controls fail too (no helper to run them on), and both
    nulls stand with their failure classes."""
    import os
    import signal
    import sys
    import time

    import conftest as pc
    from test_coding_episodes import CACHE, make_env
    from tools import oci_demo as demo

    base = Path(tempfile.mkdtemp(prefix="camg-coding-gone-"))
    base.chmod(0o711)
    cfg = pc.helper_config(base, demo.cache_root_from_env(), rootfs,
                           lower_roots=[str(demo.cache_root_from_env()), str(CACHE / "layers"),
                                        str(pc.CACHE / "helper")])
    helper = pc.start_helper(base, cfg)
    try:
        environment = make_env(prepared, helper)
        environment.start()
        task = environment.tasks[0]
        graded = environment.create_episode(task, seed=None, episode_id="gone-grade")
        finishing = environment.create_episode(task, seed=None, episode_id="gone-finish")
        try:
            graded.reset()
            graded.step(gold_action(task))
            assert graded.step({"operation": "finish"}).done
            finishing.reset()
            inits = helper.sandbox_inits()
            helper.proc.send_signal(signal.SIGKILL)
            helper.proc.wait()
            deadline = time.monotonic() + 10
            while any(os.path.exists(f"/proc/{p}") for p in inits) and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(errors.InfraFailure) as grading:
                graded.grade()
            assert proved(graded, grading.value, "grade")[:2] == (None, "grader_error")
            with pytest.raises(errors.InfraFailure) as finish:
                finishing.step({"operation": "finish"})
            reward, failure, _ = proved(finishing, finish.value, "step")
            assert reward is None and failure == finish.value.failure_class.value
        finally:
            graded.close()
            finishing.close()
            environment.stop()
        env_vars = dict(os.environ, PYTHONPATH=str(pc.ROOT))
        swept = subprocess.run([sys.executable, "-m", "helper", "--config",
                                str(base / "helper.json"), "--sweep"], cwd=pc.ROOT, env=env_vars,
                               capture_output=True, text=True, timeout=120)
        assert swept.returncode == 0, swept.stderr
    finally:
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)


def test_service_records_an_obstructing_episode_as_zero_obstructed(env, tmp_path):
    """Through the episode manager, as a trainer drives it with shell actions:
    the package kills every process of the test uid at import, the grade
    fails, the manager's null proof runs the control (the gold fix in fresh
    grader sandboxes), and the signed outcome record says 0.0, "obstructed",
    with the evidence. An agent that fills its pids limit and finishes gets
    its honest 0.0 (the loop is killed before the diff)."""
    import asyncio

    from camg.web import http_wire as wire
    from camg.episodes.manager import EpisodeManager
    from camg.episodes.outcomes import OutcomeLog
    from camg.config.service_config import Limits

    task = env.tasks[0]
    outcomes = OutcomeLog(tmp_path)
    manager = EpisodeManager(env, capacity=1, limits=Limits(), config_hash="h", outcomes=outcomes)
    kill_all = ("printf 'import os, signal\\nos.kill(-1, signal.SIGKILL)\\n' "
                ">> src/apispec/__init__.py")

    async def play(*commands):
        created = await manager.create(wire.CreateEpisode(task_id=task.task_id))
        for command in commands:
            await manager.step(created["episode_id"], wire.StepRequest(
                {"operation": "shell", "command": command}))
        return await manager.step(created["episode_id"],
                                  wire.StepRequest({"operation": "finish"}))

    async def scenario():
        return await play(kill_all), await play(canaries._FORK_LOOP)

    try:
        obstructing, filling = asyncio.run(scenario())
        assert obstructing["done"] and obstructing["reward"] == 0.0, obstructing
        assert obstructing.get("failure_class") is None, obstructing
        assert filling["reward"] == 0.0 and filling.get("failure_class") is None, filling
        first, second = outcomes.read()
        assert first["integrity"] == "obstructed", first
        assert first["integrity_evidence"][0].startswith("grade failed (grader_error)")
        assert any(e.startswith("control: the gold fix") for e in first["integrity_evidence"])
        assert second["reward"] == 0.0 and second["integrity"] == "ok", second
    finally:
        asyncio.run(manager.shutdown())
        outcomes.close()
