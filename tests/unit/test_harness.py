"""The shared harness's census (camg/sandboxes/census.py, devtools/harness/leaks.py) on
plain directories and a real child process: what it counts, and that a new
entry or an unregistered child is a leak."""

from __future__ import annotations

import os
import subprocess

from camg.sandboxes import census
from devtools.harness.leaks import LeakWatch, foreign


def _config(tmp_path):
    return {"state_dir": str(tmp_path / "state"), "upper_root": str(tmp_path / "uppers")}


def test_holdings_count_ledger_uppers_and_nested_cgroups(tmp_path):
    config = _config(tmp_path)
    assert census.holdings(config, [tmp_path / "cg"], (str(tmp_path),)) == {
        "ledger records": [], "uppers": [], "cgroups": [], "processes": [], "mounts": []}
    (tmp_path / "state" / "ledger").mkdir(parents=True)
    (tmp_path / "state" / "ledger" / "sbx-1").write_text("{}")
    (tmp_path / "uppers" / "sbx-1").mkdir(parents=True)
    (tmp_path / "cg" / "sbx-1" / "inner").mkdir(parents=True)
    (tmp_path / "cg" / "sbx-1" / "cgroup.procs").write_text("41\n42\n")
    (tmp_path / "cg" / "supervisor").mkdir()
    held = census.holdings(config, [tmp_path / "cg"], (str(tmp_path),))
    assert held["ledger records"] == ["sbx-1"] and held["uppers"] == ["sbx-1"]
    assert held["cgroups"] == [str(tmp_path / "cg" / "sbx-1"), str(tmp_path / "cg" / "sbx-1" / "inner")]
    assert held["processes"] == ["41", "42"]
    assert held["mounts"] == []


def test_mounts_are_counted_strictly_below_the_directories():
    assert "/proc" in census.mounts_under(("/",))
    assert "/proc" not in census.mounts_under(("/proc",))


def test_a_new_state_entry_and_an_unregistered_child_are_leaks(tmp_path):
    watch = LeakWatch()
    watch.state_root(tmp_path)
    before = watch.snapshot()
    (tmp_path / "left").write_text("")
    child = subprocess.Popen(["sleep", "30"])
    try:
        leaks = watch.leaks(before)
        assert f"state entry {tmp_path / 'left'}" in leaks
        [named] = [leak for leak in leaks if leak.startswith(f"process {child.pid} ")]
        # the message says what it runs and whose child it is
        assert named in (f"process {child.pid} (parent {os.getpid()}: sleep 30)",
                         f"process {child.pid} (parent {os.getpid()}: )")  # not yet exec'd
        watch.allow_process(child.pid)
        watch.forget_state_under(tmp_path.parent)
        # (mounts, cgroups and containers of other runs on a shared machine aside)
        assert [leak for leak in watch.leaks(before) if leak.startswith(("state", "process"))] == []
    finally:
        child.kill()
        child.wait()


def test_foreign_means_tagged_with_another_live_pid():
    assert foreign("camg-test-1-x")            # pid 1 lives and is not us
    assert not foreign(f"camg-test-{__import__('os').getpid()}-x")
    assert not foreign("camg-test-x")          # untagged: ours to check


def test_a_reused_pid_does_not_own_what_an_earlier_holder_left(tmp_path):
    """A killed run's leftovers carry its dead pid; a later process given
    that pid did not make them. Judged by liveness alone, they dropped out
    of the snapshots while that process ran and came back as "new" leaks
    when it ended (a rehearsal after a killed one failed a test that way)."""
    import subprocess
    import time
    left = tmp_path / "left-by-an-earlier-run"
    left.mkdir()
    time.sleep(1.0)  # past the half second of slack
    child = subprocess.Popen(["sleep", "30"])
    try:
        name = f"camg-test-{child.pid}-x"
        made_later = time.time()
        assert foreign(name, made_later)                    # the live run's own
        assert foreign(name)                                # when unknown: liveness
        assert not foreign(name, left.stat().st_ctime)      # changed before it started
    finally:
        child.kill()
        child.wait()
    assert not foreign(name, made_later)                    # its run ended: ours to check
