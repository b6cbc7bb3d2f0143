"""A system-test run killed before its teardown leaves its cgroups (its own
and its guest dockerd's, below the cgroup it started in); the next run's
OwnCgroup.create sweeps them: empty ones of dead runs only, never a live
run's or this process's."""

from __future__ import annotations

import os
import subprocess
import uuid

from systest_cgroup import CGROOT, sweep_stale


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_killed_runs_cgroups_go_and_live_ones_stay():
    # tagged with this pid: the privileged lane's leak check, beside this
    # one, leaves a live run's cgroups alone
    parent = CGROOT / "memory" / f"camg-systest-sweep-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:8]
    dead = parent / f"camg-systest-{_dead_pid()}-{tag}-docker"
    mine = parent / f"camg-systest-{os.getpid()}-{tag}"
    live = parent / f"camg-systest-1-{tag}"   # pid 1 started before it was made
    try:
        for path in (dead / "inner", mine, live):
            path.mkdir(parents=True)
        assert sweep_stale() == []
        assert not dead.exists()
        assert mine.is_dir() and live.is_dir()
    finally:
        for path in (dead / "inner", dead, mine, live, parent):
            if path.is_dir():
                path.rmdir()
