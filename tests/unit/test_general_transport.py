"""The seed-001 software transport in process (as root: commands run as uid 2000)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support import mimo_tasks
from tests.support.mimo_tasks import GOLD, world_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as uid 2000 (CI runs as root)")

from mimoagent.transport import common, software  # noqa: E402


@pytest.fixture
def env():
    base = world_dir("mimo-transport.")
    cwd = base / "testbed"
    mimo_tasks.code_task(base, cwd=cwd)
    cls = software.bind(base / "task", workspaces=(cwd,))
    yield cls(), cwd
    shutil.rmtree(base, ignore_errors=True)


def shell(command):
    return software.ShellAction(operation="shell", command=command)


FINISH = software.ShellAction(operation="finish")


def test_reset_strips_fix_history_and_runs_as_agent(env):
    e, cwd = env
    obs = e.reset()
    assert "add() subtracts" in obs.output and obs.task_id == "calc-001"
    assert "Commands time out after 60 seconds" in obs.output
    out = e.step(shell("id -u; id -G; pwd; echo $HOME"))
    assert out.output.split() == ["2000", "2000", str(cwd), "/home/arena-agent"]
    history = e.step(shell("git log --all --oneline | wc -l; git branch -a; git grep -c 'a + b' $(git rev-list --all) || echo none"))
    lines = history.output.split()
    assert lines[0] == "1" and "none" in lines and "upstream-fix" not in history.output
    assert not (cwd / "test_calc.py").exists()


def test_gold_scores_one_and_terminal_is_sticky(env):
    e, cwd = env
    e.reset()
    r = e.step(shell(f"cat > /tmp/gold.$$ <<'EOF'\n{GOLD}EOF\ngit apply /tmp/gold.$$ && echo applied"))
    assert "applied" in r.output
    done = e.step(FINISH)
    assert done.done and done.reward == 1.0 and done.exit_code == 0
    assert e.step(shell("echo again")) is done


def test_noop_scores_zero(env):
    e, _ = env
    e.reset()
    done = e.step(FINISH)
    assert done.done and done.reward == 0.0 and done.exit_code != 0


def test_planted_test_file_is_replaced(env):
    e, _ = env
    e.reset()
    e.step(shell("printf 'def test_add():\\n    pass\\ndef test_mul():\\n    pass\\n' > test_calc.py"))
    assert e.step(FINISH).reward == 0.0


def test_output_truncated_to_final_12000_bytes(env):
    e, _ = env
    e.reset()
    out = e.step(shell("head -c 20000 /dev/zero | tr '\\0' a; echo END")).output
    assert out.startswith("[output truncated to final 12000 bytes]\n")
    assert out.endswith("aEND\n") and len(out.split("\n", 1)[1].encode()) == 12000


def test_timeout_exit_124(env):
    e, _ = env
    e.reset()
    out = e.step(shell("sleep 30"), timeout_s=1)
    assert out.exit_code == 124 and out.output.endswith("[command timed out]")


def test_step_64_finishes(env):
    e, _ = env
    e.reset()
    for _ in range(63):
        assert not e.step(shell("true")).done
    last = e.step(shell("true"))
    assert last.done and last.reward == 0.0


def test_verifier_infra_failure_gives_no_reward(env):
    e, cwd = env
    e.reset()
    # The agent makes the repository unusable for git: resetting the test files fails.
    e.step(shell("rm -rf .git"))
    with pytest.raises(common.InfraError) as info:
        e.step(FINISH)
    assert info.value.failure_class == "grader_error"


def test_command_length_bounded():
    with pytest.raises(Exception):
        software.ShellAction(operation="shell", command="x" * 16001)


def test_wrong_task_id_refused(env):
    e, _ = env
    with pytest.raises(ValueError):
        e.reset(task_id="other")


def test_prewarmed_reset_takes_the_prepared_workspace():
    import time

    base = world_dir("mimo-prewarm.")
    try:
        cwd = base / "testbed"
        mimo_tasks.code_task(base, cwd=cwd)
        cls = software.bind(base / "task", workspaces=(cwd,))
        cls.prewarm()
        time.sleep(3)
        started = time.monotonic()
        env = cls()
        env.reset()
        assert time.monotonic() - started < 0.2  # nothing left to prepare
        assert env.step(shell("git branch -a | grep -c upstream-fix || true")).output.strip() == "0"
        assert env.step(FINISH).reward == 0.0
    finally:
        shutil.rmtree(base, ignore_errors=True)
