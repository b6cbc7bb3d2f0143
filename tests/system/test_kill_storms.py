"""Kill storms under real systemd (issue 11): ``kill -9`` of the helper, of
each environment service and of Coding's grader sandbox, at random points
of an episode (reset, mid-step, grading, idle). After every kill each unit
is back, every sandbox is reclaimed within 5 s, every outcome record
parses, and the in-flight episode ended as packaging/README.md ("Kill
storms") promises. The storm itself is tools/reliability/killstorm.py.

CI runs 3 kills per target. The full storm (20 each):

    CAMG_KILLSTORM_KILLS=20 flock /tmp/camg-privileged.lock \\
        .venv/bin/pytest tests/system/test_kill_storms.py -q -s -p no:cacheprovider

Environments: every one the installed checkout registers (``python -m
camg.plugins --names`` in the guest) whose unit starts here; one that does
not start gets a "not run" row saying why, and fails the test only if it is
Coding or Shop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest

from camg import plugins
from systest_guest import diagnose, leftovers, show, wait_for
from tools.reliability.killstorm import storm
from tools.reliability.killstorm_guest import Guest, describe
from tools.reliability.table import Row, render

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

KILLS = int(os.environ.get("CAMG_KILLSTORM_KILLS", "3"))
SEED = int(os.environ.get("CAMG_KILLSTORM_SEED", str(int(time.time()) % 100000)))
REQUIRED = ("coding", "shop")


def _start(machine, env: str) -> str | None:
    """Start camg-<env>; None when active, else why not."""
    unit = f"camg-{env}.service"
    if machine.run(["systemctl", "cat", unit], check=False).returncode != 0:
        return f"{unit} is not installed"
    machine.run(["systemctl", "start", "--no-block", unit])

    def settled():
        state = show(machine, unit, "ActiveState", "SubState")
        if state["SubState"] == "auto-restart":  # exited; Restart= would loop
            return "exited, restarting"
        return state["ActiveState"] if state["ActiveState"] in ("active", "failed") else None

    try:
        state = wait_for(settled, 300, f"{unit} to start", interval=0.5)
    except AssertionError as exc:
        state = str(exc)
    if state == "active":
        return None
    # The service's own last words, not systemd's lines about it.
    said = [line for line in machine.run(["journalctl", "--no-pager", "-o", "cat", "-n", "40",
                                          "-u", unit, f"SYSLOG_IDENTIFIER=camg-{env}"],
                                         check=False).stdout.splitlines() if len(line) > 3]
    why = said[-1] if said else "no output"
    machine.run(["systemctl", "stop", unit], check=False, timeout=180)
    machine.run(["systemctl", "reset-failed", unit], check=False)
    return f"{unit} did not start ({state}): {why[-240:]}"


def test_kill_storm(machine):
    names = machine.run(["/srv/camg/service-venv/bin/python", "-m", "camg.plugins",
                         "--names"]).stdout.split()
    assert set(REQUIRED) <= set(names), names
    guest = Guest(machine.run, lambda: leftovers(machine))
    envs, rows = [], []
    for name in names:
        why = _start(machine, name)
        if why is None:
            envs.append(describe(guest, name, plugins.get(name).port))
        else:
            rows.append(Row("kill storm", name, "-", why, None))
    for row in rows:
        assert row.environment not in REQUIRED, row.counted

    print(f"\nkill storm: {KILLS} kills per target, seed {SEED}, "
          f"environments {[e.name for e in envs]}", flush=True)
    started = time.monotonic()
    storm_rows, kills = storm(guest, envs, KILLS, SEED,
                              log=lambda s: print(f"[{time.monotonic() - started:6.1f}s] {s}",
                                                  flush=True))
    rows = storm_rows + rows
    # What the master released when it replaced a killed worker (camg/serve.py).
    replaced = machine.run(["journalctl", "--no-pager", "-o", "cat", "-g", "worker replaced"],
                           check=False).stdout.strip()
    print(replaced or "(no worker replaced)")
    print(render(rows))
    print(f"({len(kills)} kills in {time.monotonic() - started:.0f} s, seed {SEED})")
    if os.environ.get("CAMG_KILLSTORM_REPORT"):
        with open(os.environ["CAMG_KILLSTORM_REPORT"], "w") as out:
            json.dump([dataclasses.asdict(r) for r in rows], out, indent=1)

    problems = [f"{k.target} {k.env} at {k.point}: {p}" for k in kills for p in k.problems]
    assert not problems, "\n".join(problems[:20]) + f"\n{diagnose(machine)}"
    targets = {(r.environment, r.done.split(" x")[0]) for r in storm_rows}
    assert ("all", "kill -9 camg-helper") in targets
    for name in (e.name for e in envs):
        assert (name, f"kill -9 camg-{name}") in targets
    assert ("coding", "kill -9 camg-coding's grader sandbox") in targets
    assert all(r.ok for r in storm_rows), render(storm_rows)


def test_stopping_camg_target_after_the_storm_leaves_nothing_behind(machine):
    machine.run(["systemctl", "stop", "camg.target"], timeout=300)
    units = [u.split()[0] for u in machine.run(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "camg-*"]).stdout.splitlines()]
    wait_for(lambda: all(show(machine, u, "ActiveState")["ActiveState"] in ("inactive", "failed")
                         for u in units), 300, "every camg unit to stop")
    assert leftovers(machine) == {}
