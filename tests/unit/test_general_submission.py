"""General's opensource-code grade in a fresh container, in process.

The agent's transport ``collect``s its changes (mimoagent.transport.submission),
the service checks them (environments.general.submission), and a second,
untouched world's transport ``grade``s them: only regular files of the
repository travel. Two worlds stand for the two containers (as in
test_general_integrity.py: a test agent uid, root runs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess

import pytest

from tests.support import mimo_tasks
from tests.support.mimo_tasks import world_dir

from environments.general import integrity
from environments.general import submission as checked
from camg import errors
from camg.grading.guard_verdict import GUARD_DIR
from mimoagent.transport import common, software, verifier_guard  # noqa: E402
from mimoagent.transport import submission as carried  # noqa: E402

UID = 2931
root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason="runs commands as another uid (CI runs as root)")
APPLY_GOLD = (f"cat > gold.patch.$$ <<'EOF'\n{mimo_tasks.GOLD}EOF\n"
              "git apply gold.patch.$$ && rm gold.patch.$$ && echo applied")


def _world(name):
    base = world_dir(f"mimo-{name}.")
    (base / "shared-tmp").mkdir(mode=0o1777)
    os.chmod(base / "shared-tmp", 0o1777)
    config = verifier_guard.GuardConfig(tmp_dirs=(str(base / "shared-tmp"),),
                                        state_root=str(base / "state"),
                                        changes_file=str(base / "logs" / "changes.json"),
                                        reap_deadline_s=5.0, test_guard_dir=GUARD_DIR,
                                        guard_record=str(base / "logs" / "guard.json"))
    cwd = base / "testbed"
    mimo_tasks.code_task(base, cwd=cwd)
    env = software.bind(base / "task", agent_uid=UID, workspaces=(cwd,), guard=config)()
    env.reset()
    return base, config, env, cwd


@pytest.fixture
def worlds():
    made = []

    def make(name):
        made.append(_world(name))
        return made[-1]

    yield make
    subprocess.run(["pkill", "-KILL", "-U", str(UID)], check=False)
    for base, *_ in made:
        shutil.rmtree(base, ignore_errors=True)


def shell(command):
    return software.ShellAction(operation="shell", command=command)


def collect(env):
    got = env.step(software.ShellAction(operation="collect"))
    assert got.done and got.reward is None
    return got


def grade(env, submission):
    return env.step(software.ShellAction(operation="grade", submission=submission))


@root_only
def test_gold_travels_and_earns_one_in_the_fresh_world(worlds):
    _, _, agent, _ = worlds("agent")
    assert "applied" in agent.step(shell(APPLY_GOLD)).output
    agent.step(shell("(setsid sleep 300 >/dev/null 2>&1 &); sleep 0.3; "
                     "mkdir -p __pycache__ && echo junk > __pycache__/calc.cpython-311.pyc; "
                     "ln -s /etc/passwd out; mkfifo pipe; echo hi > $HOME/notes 2>/dev/null; "
                     "printf 'x\\n' > new.txt; chmod +x new.txt; rm README"))
    got = collect(agent)
    assert got.processes_killed >= 1 and verifier_guard.agent_processes(UID) == []
    sub = got.submission
    assert {f["path"] for f in sub["files"]} == {"calc.py", "new.txt"}, sub
    modes = {f["path"]: f["mode"] for f in sub["files"]}
    assert sub["deleted"] == ["README"] and modes["new.txt"] == 0o755
    skipped = {s["path"]: s["why"] for s in sub["skipped"]}
    assert set(skipped) == {"__pycache__/calc.cpython-311.pyc", "out", "pipe"}, skipped
    # The collected container is done: the verifier never runs there.
    assert collect(agent) is got
    base, config, fresh, cwd = worlds("fresh")
    done = grade(fresh, checked.checked(json.loads(json.dumps(sub))))
    assert done.done and done.reward == 1.0, done.output
    assert not (cwd / "README").exists() and not (cwd / "out").exists()
    st = os.stat(cwd / "new.txt")
    assert st.st_uid == UID and st.st_mode & 0o777 == 0o755
    applied = json.loads(open(config.changes_file).read())
    assert {c["path"] for c in applied["changes"]} == {"calc.py", "new.txt", "README"}
    # The service screens the agent's whole record: the link out is still seen.
    reward, verdict = integrity.verdict(
        got.changes | {"guard": applied["guard"], "test_patch_paths": applied["test_patch_paths"]},
        json.loads(open(config.guard_record).read()))
    assert reward == 0.0 and {(e["rule"], e["path"]) for e in verdict["integrity_evidence"]} == {
        ("symlink_outside_repo", "out")}, verdict


@root_only
def test_grade_refuses_a_container_where_the_agent_acted(worlds):
    _, _, env, _ = worlds("used")
    env.step(shell("true"))
    with pytest.raises(common.InfraError) as info:
        grade(env, {"files": [], "deleted": []})
    assert info.value.failure_class == "grader_error" and "fresh" in str(info.value)


@root_only
def test_apply_writes_only_inside_the_repository(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "link").symlink_to(outside)
    (repo / "pkg" / "old.py").write_text("old\n")
    sub = {"files": [{"path": "link/x.py", "mode": 0o644,
                      "data": base64.b64encode(b"in").decode()}],
           "deleted": ["link/y", "pkg/old.py"]}
    (outside / "y").write_text("keep")
    got = carried.apply(str(repo), sub, UID)
    # The link in the way became a directory of the repository's.
    assert got == {"files": 1, "bytes": 2, "removed": 1}
    assert (repo / "link").is_dir() and not (repo / "link").is_symlink()
    assert (repo / "link" / "x.py").read_text() == "in" and (outside / "y").read_text() == "keep"
    assert list(outside.iterdir()) == [outside / "y"] and not (repo / "pkg" / "old.py").exists()


@pytest.mark.parametrize("path,why", [
    ("../x.py", "not a normal relative path"), ("/etc/x", "not a normal relative path"),
    ("a//b", "not a normal relative path"), ("a/./b", "not a normal relative path"),
    (".git/config", "under .git"), ("sub/.git/hooks/pre-commit", "under .git"),
    ("m.pyc", "bytecode"), ("__pycache__/m.py", "bytecode"), ("", "not a path"),
    ("a\0b", "not a path")])
def test_paths_that_never_travel(path, why):
    assert carried.check_path(path) == why
    with pytest.raises(errors.GraderError):
        checked.checked({"files": [{"path": path, "mode": 0o644, "data": ""}], "deleted": []})
    with pytest.raises(errors.GraderError):
        checked.checked({"files": [], "deleted": [path]})


def test_the_service_checks_bounds_and_shape():
    data = base64.b64encode(b"x" * (carried.FILE_LIMIT + 1)).decode()
    for bad in ({"files": [{"path": "a", "mode": 0o644, "data": data}], "deleted": []},
                {"files": [{"path": "a", "mode": 0o4755, "data": ""}], "deleted": []},
                {"files": [{"path": "a", "mode": 0o644, "data": "!!"}], "deleted": []},
                {"files": [{"path": "a", "mode": 0o644, "data": "", "x": 1}], "deleted": []},
                {"files": [], "deleted": [], "extra": 1}, {"files": []}, [],
                {"files": [{"path": "a", "mode": 0o644, "data": ""}] * 2, "deleted": []}):
        with pytest.raises(errors.GraderError):
            checked.checked(bad)
    skipped = [{"path": "l", "why": "not a regular file (link)"}]
    ok = {"files": [{"path": "a/b.py", "mode": 0o755, "data": "eA=="}], "deleted": ["c"],
          "skipped": skipped}
    assert checked.checked(ok) == {"files": ok["files"], "deleted": ["c"]}
    assert checked.stats(ok) == {"files": 1, "bytes": 1, "deleted": 1, "skipped": 1,
                                 "skipped_paths": skipped}


def test_the_two_ends_share_their_bounds():
    names = ("FILE_LIMIT", "TOTAL_LIMIT", "COUNT_LIMIT", "DELETE_LIMIT", "PATH_LIMIT", "MODES")
    assert [getattr(checked, n) for n in names] == [getattr(carried, n) for n in names]
