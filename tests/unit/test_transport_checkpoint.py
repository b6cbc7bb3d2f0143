"""The transport's checkpoint (mimoagent.transport.checkpoint), in process: a
second transport on the same filesystem -- what a forked container starts --
continues the first one's episode (step count, the software verifier's setup
snapshot, the general transport's findings) instead of preparing afresh over
the agent's work, and a finding made before the fork survives it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from tests.support import mimo_tasks
from tests.support.mimo_tasks import GOLD, world_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as uid 2000 (CI runs as root)")

from mimoagent.transport import checkpoint, general, software  # noqa: E402


def test_nothing_is_written_or_resumed_without_a_directory(tmp_path):
    c = checkpoint.Checkpoint(None)
    c.save("episode.json", {"step_count": 3})
    assert c.load("episode.json") is None and not c.resuming() and c.resumed() is None


def test_records_are_root_only_and_a_lone_episode_record_is_refused(tmp_path):
    c = checkpoint.Checkpoint(str(tmp_path / "ck"))
    c.save("episode.json", {"step_count": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "ck").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "ck" / "episode.json").st_mode) == 0o600
    assert c.resuming()
    with pytest.raises(RuntimeError, match="never set up"):
        c.resumed()


# The guard's reap kills every process of the agent uid on the host: a uid
# of this module's own (test_general_integrity uses 2931), never 2000.
UID = 2932


@pytest.fixture
def code_world():
    base = world_dir("mimo-ckpt.")
    cwd = base / "testbed"
    mimo_tasks.code_task(base, cwd=cwd)
    yield base, cwd
    subprocess.run(["pkill", "-KILL", "-U", str(UID)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def shell(command):
    return software.ShellAction(operation="shell", command=command)


def test_software_child_continues_the_parents_episode(code_world):
    from camg.grading.guard_verdict import GUARD_DIR
    from mimoagent.transport.verifier_guard import GuardConfig

    base, cwd = code_world
    guard = GuardConfig(tmp_dirs=(), state_root=str(base / "verifier-state"),
                        changes_file=str(base / "changes.json"),
                        guard_record=str(base / "guard.json"), test_guard_dir=GUARD_DIR)
    ck = str(base / "checkpoint")
    parent = software.bind(base / "task", agent_uid=UID, workspaces=(cwd,), guard=guard,
                           checkpoint=ck)()
    parent.reset()
    r = parent.step(shell(f"cat > /tmp/gold.$$ <<'EOF'\n{GOLD}EOF\ngit apply /tmp/gold.$$ && echo applied"))
    assert "applied" in r.output
    parent.step(shell("echo second"))
    # A fresh transport (a fork's child) on the same files: no setup again
    # (which would re-extract the workspace over the fix), the count goes on.
    child = software.bind(base / "task", agent_uid=UID, workspaces=(cwd,), guard=guard,
                          checkpoint=ck)()
    child.reset(episode_id="child-1")
    assert child.state.step_count == 2
    assert "a + b" in (cwd / "calc.py").read_text()
    assert child.verifier.base_ref == parent.verifier.base_ref
    assert child.verifier.pristine.entries == parent.verifier.pristine.entries
    child.step(shell("echo third"))
    assert checkpoint.Checkpoint(ck).load("episode.json") == {"episode_id": "child-1", "step_count": 3}
    done = child.step(software.ShellAction(operation="finish"))
    assert done.done and done.reward == 1.0 and done.exit_code == 0
    # the child's change record is walked against the parent's setup
    # snapshot: the fix made before the fork is in it
    import json
    changed = {c["path"] for c in json.loads((base / "changes.json").read_text())["changes"]}
    assert "calc.py" in changed


@pytest.fixture
def agent_world():
    base = mimo_tasks.world_dir("mimo-ckpt-general.")
    root, oracle, paths = mimo_tasks.general_task(base, 0)
    yield base, root, oracle, paths
    shutil.rmtree(base, ignore_errors=True)


def test_general_child_keeps_the_parents_findings_and_tools(agent_world):
    base, root, oracle, paths = agent_world
    ck = str(base / "checkpoint")
    parent = general.bind(root, reap=False, checkpoint=ck, **paths)()
    first = parent.reset()
    # an attempt on the grade before the fork: the transport records it
    parent.step(general.GeneralAction(operation="shell", command="cat /opt/mimo-task/verifier_meta.json"))
    assert parent.findings
    child = general.bind(root, reap=False, checkpoint=ck, **paths)()
    again = child.reset(episode_id="child-1")
    assert again.tools == first.tools and child.state.step_count == 1
    assert child.findings == parent.findings
    done = child.step(general.GeneralAction(operation="finish", answer="nothing"))
    assert done.done
    assert [f["rule"] for f in done.integrity_evidence] == [f["rule"] for f in parent.findings]
