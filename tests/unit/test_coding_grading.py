"""The SWE-smith grading procedure on a real (small) task set, run locally.

The eval script, the agent-diff command and swebench's parsing are the ones
the service uses; only the sandbox is replaced by a local checkout, so these
tests need no root. The same attacks are re-run in sandboxes on the demo
image by tests/privileged/test_coding_episodes.py.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from camg.errors import GraderError
from environments.coding import (diff_paths, grader_scripts, integrity, layers, log_evaluation, mirrors,
                            profiles, rows)
from environments.coding.prepare_layers import build_layers_as_root
from environments.coding.checks import synthetic


# One key per guard session of a script: the eval script probes, then runs.
KEYS = (b"a1" * 32, b"b2" * 32)
GUARD = grader_scripts.GUARD_SOURCE


def local_eval(script: str, diff: bytes, cwd: str, timeout: float,
               keys: list[bytes]) -> tuple[str, int, bool]:
    """Run a grader script on a local checkout instead of a grader sandbox,
    ``keys`` (as many as the script takes) and ``diff`` on its stdin."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST", "CAMG_GUARD"))}
    env["CAMG_GRADE_TMP"] = os.path.join(os.path.dirname(os.path.abspath(cwd)),
                                         ".camg-grade-" + os.path.basename(cwd))
    try:
        proc = subprocess.run(["bash", "-c", script],
                              input=grader_scripts.script_stdin(keys, diff), cwd=cwd,
                              env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"").decode("utf-8", "replace"), -1, True
    return proc.stdout.decode("utf-8", "replace"), proc.returncode, False


@pytest.fixture(scope="session")
def task_set():
    root = synthetic.task_set(sys.executable)
    data = [json.loads(line) for line in (root / "tasks.jsonl").read_text().splitlines()]
    return root, [rows.validate(r, i) for i, r in enumerate(data)]


@pytest.fixture(scope="session")
def task_layers(task_set, tmp_path_factory):
    root, task_rows = task_set
    refs = mirrors.resolve(root / "mirrors", task_rows)
    base = tmp_path_factory.mktemp("layers")
    return {ref.branch: (ref, build_layers_as_root(base, ref, privileged=False))
            for ref in refs}


def grade(task_layers, row, diff: bytes, tmp_path,
          suspicious_reward: float = 0.0) -> log_evaluation.Report:
    ref, built = task_layers[row.instance_id]
    tmp_path.mkdir(parents=True, exist_ok=True)
    checkout = tmp_path / "grader"
    subprocess.run(["cp", "-a", str(Path(built.grader) / "testbed"), str(checkout)], check=True)
    profiles.for_repo(row.repo)
    profile = profiles.local_profile(row.mirror_name, sys.executable, str(checkout))
    kept, dropped = diff_paths.filter_diff(diff)
    log, code, timed_out = local_eval(grader_scripts.eval_script(profile, ref.tests, GUARD),
                                      kept, str(checkout), timeout=120, keys=KEYS)
    return log_evaluation.evaluate(log, row, exit_code=code, timed_out=timed_out, dropped=dropped,
                                   keys=KEYS, findings=integrity.screen(diff),
                                   suspicious_reward=suspicious_reward)


def agent_workspace(task_layers, row, tmp_path) -> tuple[Path, Path, str]:
    """A copy of the agent layer: (workspace, private git dir, snapshot)."""
    _, built = task_layers[row.instance_id]
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "agent"
    subprocess.run(["cp", "-a", built.agent, str(copy)], check=True)
    return copy / "testbed", copy / layers.PRIVATE_GIT, built.snapshot


def agent_diff(workspace: Path, private: Path, snapshot: str) -> bytes:
    cmd = diff_paths.diff_command(snapshot, private_git=str(private), workdir=str(workspace))
    return subprocess.run(["bash", "-c", cmd], capture_output=True, check=True).stdout


def gold(row) -> bytes:
    return row.patch.encode()


def reverse(diff: bytes, workspace: Path) -> None:
    subprocess.run(["git", "apply", "-R", "-"], input=diff, cwd=workspace, check=True)


def test_gold_fix_resolves_every_task(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    for i, row in enumerate(task_rows):
        work, private, snapshot = agent_workspace(task_layers, row, tmp_path / str(i))
        reverse(gold(row), work)
        report = grade(task_layers, row, agent_diff(work, private, snapshot), tmp_path / str(i))
        assert report.resolved and report.reward == 1.0, (row.instance_id, report)


def test_a_file_no_diff_could_carry_ends_the_collection_before_git_reads_it(task_set, task_layers,
                                                                           tmp_path):
    _, task_rows = task_set
    work, private, snapshot = agent_workspace(task_layers, task_rows[0], tmp_path)
    command = diff_paths.diff_command(snapshot, private_git=str(private), workdir=str(work),
                                      limit=1)
    with open(work / "zz-big", "wb") as big:  # sparse: one byte over the bound
        big.truncate(1032 + 1)
    got = subprocess.run(["bash", "-c", command], capture_output=True)
    assert got.returncode == diff_paths.TOO_LARGE_EXIT and got.stdout == b"", got
    (work / "zz-big").unlink()
    (work / "zz-fits").write_bytes(b"x" * 1032)
    got = subprocess.run(["bash", "-c", command], capture_output=True)
    assert got.returncode == 0 and b"zz-fits" in got.stdout, got


def test_no_change_earns_zero_on_every_task(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    for i, row in enumerate(task_rows):
        report = grade(task_layers, row, b"", tmp_path / str(i))
        assert report.reward == 0.0 and report.reason == "tests_failed", report
        assert set(report.fail_to_pass_failed) == set(row.fail_to_pass)


def test_agent_workspace_has_no_history(task_set, task_layers):
    _, task_rows = task_set
    ref, built = task_layers[task_rows[0].instance_id]
    work = Path(built.agent) / "testbed"
    git = lambda *a: subprocess.run(["git", "-C", str(work), *a], capture_output=True,
                                    text=True, check=True).stdout
    assert git("rev-list", "--all").split() == [built.snapshot]
    assert git("for-each-ref").count("\n") == 1          # refs/heads/main only
    assert git("cat-file", "-p", "HEAD").count("parent ") == 0
    assert not (work / ".git" / "packed-refs").exists()
    assert not (work / ".git" / "logs").exists()
    assert git("rev-parse", "HEAD^{tree}").strip() == \
        mirrors.git(ref.mirror, "rev-parse", f"{ref.tip}^{{tree}}").strip()
    # The fix (the bug commit's parent content) is nowhere in the object store.
    objects = git("cat-file", "--batch-all-objects", "--batch-check").split("\n")
    base_blob = mirrors.git(ref.mirror, "rev-parse", f"{ref.tests}~1:{_bug_file(task_rows[0])}")
    assert not any(line.startswith(base_blob.strip()) for line in objects)


def _bug_file(row) -> str:
    return row.patch.split("\n", 1)[0].split(" b/", 1)[1]


@pytest.mark.parametrize("attack", ["edit_tests", "delete_tests", "conftest_skip",
                                    "conftest_xfail", "sitecustomize", "pytest_ini"])
def test_test_tampering_earns_zero(task_set, task_layers, tmp_path, attack):
    _, task_rows = task_set
    row = task_rows[0]
    work, private, snapshot = agent_workspace(task_layers, row, tmp_path)
    failing_file = row.fail_to_pass[0].split("::")[0]
    if attack == "edit_tests":
        # Recreate the hidden failing test file with trivially passing tests.
        names = [t.split("::")[-1].split("[")[0] for t in row.fail_to_pass]
        (work / failing_file).write_text("".join(f"def {n}():\n    pass\n\n" for n in set(names)))
    elif attack == "delete_tests":
        for path in (work / "tests").glob("test_*.py"):
            path.unlink()
    elif attack in ("conftest_skip", "conftest_xfail"):
        marker = "skip" if attack == "conftest_skip" else "xfail"
        (work / "tests" / "conftest.py").write_text(
            "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
            f"    for item in items:\n        item.add_marker(pytest.mark.{marker}(reason='x'))\n")
        (work / "conftest.py").write_text((work / "tests" / "conftest.py").read_text())
    elif attack == "sitecustomize":
        (work / "src" / "sitecustomize.py").write_text(
            "import os\nos.environ['PYTEST_ADDOPTS'] = '-p no:python'\n")
    elif attack == "pytest_ini":
        (work / "pytest.ini").write_text("[pytest]\naddopts = --deselect tests\n")
    report = grade(task_layers, row, agent_diff(work, private, snapshot), tmp_path)
    assert report.reward == 0.0, report
    assert report.dropped_paths, "the protected paths were not dropped from the diff"


def test_tampering_next_to_a_real_fix_keeps_the_fix(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    row = task_rows[0]
    work, private, snapshot = agent_workspace(task_layers, row, tmp_path)
    reverse(gold(row), work)
    (work / "conftest.py").write_text("raise SystemExit('collect nothing')\n")
    report = grade(task_layers, row, agent_diff(work, private, snapshot), tmp_path)
    assert report.resolved and report.dropped_paths == ("conftest.py",)


def test_broken_dot_git_cannot_forge_or_block_the_diff(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    row = task_rows[0]
    work, private, snapshot = agent_workspace(task_layers, row, tmp_path)
    reverse(gold(row), work)
    subprocess.run(["rm", "-rf", str(work / ".git")], check=True)
    subprocess.run(["mkfifo", str(work / "fifo")], check=True)
    (work / "src" / "__pycache__").mkdir(exist_ok=True)
    (work / "src" / "__pycache__" / "x.pyc").write_bytes(b"\x00\xff")
    diff = agent_diff(work, private, snapshot)
    assert b"__pycache__" not in diff and b"fifo" not in diff
    assert grade(task_layers, row, diff, tmp_path).resolved


def test_binary_and_non_utf8_changes_survive(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    row = task_rows[0]
    work, private, snapshot = agent_workspace(task_layers, row, tmp_path)
    reverse(gold(row), work)
    (work / "blob.bin").write_bytes(bytes(range(256)))
    (work / "src" / "calc" / "latin.py").write_bytes(b"# caf\xe9\nX = 1\n")
    diff = agent_diff(work, private, snapshot)
    assert b"GIT binary patch" in diff
    assert grade(task_layers, row, diff, tmp_path).resolved


def grader_checkout(task_set, task_layers, tmp_path):
    """The first task's grader testbed, copied: (row, ref, checkout, local profile)."""
    _, task_rows = task_set
    row = task_rows[0]
    ref, built = task_layers[row.instance_id]
    checkout = tmp_path / "grader"
    subprocess.run(["cp", "-a", str(Path(built.grader) / "testbed"), str(checkout)], check=True)
    return row, ref, checkout, profiles.local_profile(row.mirror_name, sys.executable, str(checkout))


def test_hanging_tests_are_not_resolved(task_set, task_layers, tmp_path):
    row, ref, checkout, profile = grader_checkout(task_set, task_layers, tmp_path)
    hang = profiles.Profile(profile.key, "sleep 30", profile.parser, 1, "demo", str(checkout))
    log, code, timed_out = local_eval(grader_scripts.eval_script(hang, ref.tests, GUARD), b"",
                                      str(checkout), timeout=1, keys=KEYS)
    assert timed_out
    report = log_evaluation.evaluate(log, row, exit_code=code, timed_out=timed_out, keys=KEYS)
    assert report.reason == "tests_timed_out" and report.reward == 0.0


def test_guard_keys_arrive_on_stdin_only(task_set, task_layers, tmp_path):
    """Keys are never in the script text or its environment (both readable
    in /proc by every process of the test uid); a script short of keys is
    the grader's failure, never a grade."""
    row, ref, checkout, profile = grader_checkout(task_set, task_layers, tmp_path)
    script = grader_scripts.eval_script(profile, ref.tests, GUARD)
    assert "CAMG_GUARD_KEY=" not in script and "CAMG_GUARD_KEYS=" in script
    log, code, _ = local_eval(script, b"", str(checkout), timeout=60, keys=KEYS[:1])
    assert code == grader_scripts.EXIT_SETUP and "camg-guard" not in log
    with pytest.raises(GraderError, match="setup failed"):
        log_evaluation.evaluate(log, row, exit_code=code, timed_out=False, keys=KEYS[:1])
    with pytest.raises(ValueError):
        grader_scripts.script_stdin([b"short"])


def test_unappliable_diff_is_not_resolved(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    bogus = (b"diff --git a/src/calc/__init__.py b/src/calc/__init__.py\n--- a/src/calc/__init__.py\n"
             b"+++ b/src/calc/__init__.py\n@@ -1,1 +1,1 @@\n-no such line\n+x\n")
    report = grade(task_layers, task_rows[0], bogus, tmp_path)
    assert report.reason == "patch_apply_failed" and report.reward == 0.0


def test_wrong_grader_state_is_a_grader_error(task_set, task_layers, tmp_path):
    row, ref, checkout, profile = grader_checkout(task_set, task_layers, tmp_path)
    log, code, timed_out = local_eval(grader_scripts.eval_script(profile, ref.tip, GUARD), b"",
                                      str(checkout), timeout=60, keys=KEYS)
    with pytest.raises(GraderError, match="setup failed"):
        log_evaluation.evaluate(log, row, exit_code=code, timed_out=timed_out, keys=KEYS)


def test_missing_markers_is_a_grader_error(task_set):
    _, task_rows = task_set
    profiles.for_repo(task_rows[0].repo)
    with pytest.raises(GraderError, match="markers"):
        log_evaluation.evaluate("killed\n", task_rows[0], exit_code=137, timed_out=False, keys=KEYS)


def test_missing_test_counts_as_failed(task_set):
    _, task_rows = task_set
    row = task_rows[0]
    profiles.for_repo(row.repo)
    ids = [*row.fail_to_pass, *row.pass_to_pass]
    passed = [f"{t} PASSED" for t in ids]
    channel = signed({"t": "hello"}, {"t": "collected", "ids": ids},
                     *({"t": "test", "id": t, "outcome": "passed"} for t in ids),
                     {"t": "end", "exitstatus": 0, "evidence": []})
    log = ("+ : '>>>>> Start Test Output'\n" + "\n".join(passed)
           + "\n+ : '>>>>> End Test Output'\n" + channel)
    assert log_evaluation.evaluate(log, row, exit_code=0, timed_out=False, keys=KEYS).resolved
    log_missing = log.replace(passed[-1] + "\n", "")
    report = log_evaluation.evaluate(log_missing, row, exit_code=0, timed_out=False, keys=KEYS)
    assert not report.resolved
    assert len(report.fail_to_pass_failed) + len(report.pass_to_pass_failed) == 1


@pytest.mark.parametrize("path,protected", [
    ("tests/test_core.py", True), ("src/pkg/tests/helpers.py", True), ("conftest.py", True),
    ("src/conftest.py", True), ("pytest.ini", True), ("tox.ini", True), ("setup.cfg", True),
    ("pyproject.toml", True), ("src/sitecustomize.py", True), ("x.pth", True),
    ("test_x.py", True), ("pkg/x_test.py", True),
    ("src/apispec/core.py", False), ("src/testament.py", False), ("README.rst", False),
])
def test_protected_paths(path, protected):
    assert diff_paths.is_protected(path) is protected


def test_filter_diff_handles_quoting_and_renames():
    diff = (b'diff --git "a/tests/t\\303\\251st.py" "b/tests/t\\303\\251st.py"\n'
            b'--- "a/tests/t\\303\\251st.py"\n+++ "b/tests/t\\303\\251st.py"\n@@ -1 +1 @@\n-a\n+b\n'
            b"diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n"
            b"diff --git a/src/y.py b/tests/y.py\nsimilarity index 100%\nrename from src/y.py\n"
            b"rename to tests/y.py\n")
    kept, dropped = diff_paths.filter_diff(diff)
    assert kept.startswith(b"diff --git a/src/x.py") and kept.count(b"diff --git") == 1
    assert dropped == ["tests/t\u00e9st.py", "tests/y.py"]


def test_preexisting_untracked_files_survive_grading(task_set, task_layers, tmp_path):
    """An image's build artifacts under tests/ are not the agent's: never removed,
    not even when the first apply method fails and the tree is reset."""
    _, task_rows = task_set
    row = task_rows[0]
    ref, built = task_layers[row.instance_id]
    checkout = tmp_path / "grader"
    subprocess.run(["cp", "-a", str(Path(built.grader) / "testbed"), str(checkout)], check=True)
    (checkout / "tests" / "_built_fixture.bin").write_bytes(b"\x00artifact")
    (checkout / "build").mkdir()
    (checkout / "build" / "ext.so").write_bytes(b"\x7fELF")
    profile = profiles.local_profile(row.mirror_name, sys.executable, str(checkout))
    fuzzy = row.patch.replace("\n ", "\n  ", 1).encode()   # context off by one space
    reverse_fix = subprocess.run(["git", "-C", str(checkout), "apply", "-R", "--check", "-"],
                                 input=fuzzy, capture_output=True)
    assert reverse_fix.returncode != 0  # git apply must fail: exercise the fallbacks
    log, code, timed_out = local_eval(grader_scripts.eval_script(profile, ref.tests, GUARD),
                                      fuzzy, str(checkout), timeout=120, keys=KEYS)
    assert (checkout / "tests" / "_built_fixture.bin").exists()
    assert (checkout / "build" / "ext.so").exists()
    assert "trying the next method" in log


def signed(*records, key=KEYS[1]) -> str:
    from camg.grading.guard_verdict import sign_records
    return sign_records(records, key)


# --- the code screen's verdict (camg.grading.code_screen) -------------------------------

def _fixed_with(task_layers, row, tmp_path, addition: str) -> bytes:
    """The gold fix, and ``addition`` appended to the file it fixes."""
    work, private, snapshot = agent_workspace(task_layers, row, tmp_path)
    reverse(gold(row), work)
    with open(work / _bug_file(row), "a", encoding="utf-8") as handle:
        handle.write(addition)
    return agent_diff(work, private, snapshot)


def test_a_fix_the_code_screen_flags_is_suspicious(task_set, task_layers, tmp_path):
    """The tests pass (resolved), the outcome says suspicious with the rule
    and the line, and the reward is the deployment's setting."""
    _, task_rows = task_set
    row = task_rows[0]
    diff = _fixed_with(task_layers, row, tmp_path, "\nimport atexit as _ae  # noqa\n")
    report = grade(task_layers, row, diff, tmp_path / "graded")
    assert report.resolved and report.reason == "resolved", report
    assert report.integrity == "suspicious" and report.reward == 0.0, report
    [finding] = report.evidence
    assert finding["rule"] == "exit_hooks" and finding["path"] == _bug_file(row)
    assert finding["detail"].startswith(f"{_bug_file(row)}:") and "import atexit" in finding["detail"]
    assert report.outcome()["integrity"] == "suspicious"
    assert report.outcome()["integrity_evidence"] == [finding]
    paid = grade(task_layers, row, diff, tmp_path / "paid", suspicious_reward=0.5)
    assert paid.integrity == "suspicious" and paid.reward == 0.5
    # not resolved: nothing, whatever the setting
    assert dataclasses.replace(paid, resolved=False).reward == 0.0


def test_tampering_wins_over_suspicion(task_set, task_layers, tmp_path):
    _, task_rows = task_set
    row = task_rows[0]
    diff = _fixed_with(task_layers, row, tmp_path,
                       "\nimport ctypes as _c  # noqa\nif False:\n    os._exit(0)\n")
    report = grade(task_layers, row, diff, tmp_path / "graded", suspicious_reward=1.0)
    assert report.integrity == "tampered" and report.reward == 0.0
    assert {"runner_internals", "native_code"} <= {e["rule"] for e in report.evidence}


def test_suspicious_reward_setting_is_validated():
    from environments.coding.settings import Settings

    base = {"mirrors_root": "/m", "images": "/i.json"}
    assert Settings(**base).suspicious_reward == 0.0
    assert Settings(**base, suspicious_reward=0.5).suspicious_reward == 0.5
    for bad in (-0.5, 2.0, True):
        with pytest.raises(ValueError, match="suspicious_reward"):
            Settings(**base, suspicious_reward=bad)
