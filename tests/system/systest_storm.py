"""The kill storm (issue 11; devtools/reliability/killstorm.py) on a booted
guest that serves the demo under systemd: what test_newcomer's systemd
variant runs once the demo is up.

CI runs one kill per target (and the helper once per environment that needs
it); the full storm, 20 per target, is

    CAMG_KILLSTORM_KILLS=20 flock /tmp/camg-privileged.lock \\
        .venv/bin/pytest tests/system/test_newcomer.py -k under_systemd -q -s -p no:cacheprovider

or ``python -m devtools.reliability --full --suites killstorm``, which runs
that and prints the rows in the reliability table. CAMG_KILLSTORM_SEED=N
repeats a storm (the seed is printed); CAMG_KILLSTORM_ONLY=service:general,
helper:all runs only those rows of its plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from systest_demo_checks import KillChecks
from systest_guest import diagnose, leftovers
from systest_machine import Machine
from devtools.reliability.killstorm import storm
from devtools.reliability.killstorm_guest import Guest, describe
from devtools.reliability.table import render

from camg import plugins

KILLS = int(os.environ.get("CAMG_KILLSTORM_KILLS", "1"))
SEED = int(os.environ.get("CAMG_KILLSTORM_SEED", str(int(time.time()) % 100000)))
ONLY = {tuple(pair.split(":", 1)) for pair in os.environ.get("CAMG_KILLSTORM_ONLY", "").split(",")
        if pair} or None


def census(machine: Machine) -> dict[str, list[str]]:
    """leftovers() of the helper's sandboxes, minus what the guest's dockerd
    holds for running task containers (their overlay mounts, and the agent's
    uid-2000 processes inside them): those are counted per container by the
    storm itself."""
    found = leftovers(machine)
    mounts = [m for m in found.pop("mounts", []) if " /var/lib/docker/" not in m]
    if mounts:
        found["mounts"] = mounts
    if found.pop("agent processes", None):
        out = machine.run(["ps", "-u", "2000", "-o", "pid=,cgroup=,args="], check=False).stdout
        agent = [line for line in out.splitlines() if line.strip() and "/docker/" not in line]
        if agent:
            found["agent processes"] = agent
    return found


def run_storm(machine: Machine, names: list[str], check: KillChecks | None = None) -> None:
    """``check``: more checks after every kill (systest_demo_checks)."""
    guest = Guest(machine.run, lambda: census(machine))
    envs = [describe(guest, name, plugins.get(name).port) for name in names]
    print(f"\nkill storm: {KILLS} kill(s) per target, seed {SEED}, "
          f"environments {[e.name for e in envs]}", flush=True)
    started = time.monotonic()
    rows, kills = storm(guest, envs, KILLS, SEED,
                        log=lambda s: print(f"[{time.monotonic() - started:6.1f}s] {s}", flush=True),
                        only=ONLY, check=check)
    if check is not None:
        print(f"(the demo checks after each kill took {check.seconds:.1f} s of the storm)")
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
    assert rows and all(r.ok for r in rows), render(rows)
    if ONLY:
        return
    targets = {(r.environment, r.done.split(" x")[0]) for r in rows}
    assert ("all", "kill -9 camg-helper") in targets, targets
    for env in envs:
        assert (env.name, f"kill -9 camg-{env.name}") in targets, targets
        assert (env.name, f"kill -9 camg-{env.name}'s worker") in targets, targets
        if env.grader:
            assert (env.name, f"kill -9 camg-{env.name}'s {env.grader_name}") in targets, targets
