"""A kill storm's plan and its report: which (target, environment, kill
point) comes when, one table row per target, and ``rows()``, which runs the
storm's system test for the reliability runner."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from devtools.reliability.killstorm_guest import POINTS, Env
from devtools.reliability.rig import TMP_PREFIX
from devtools.reliability.table import Row

RECLAIM_S = 5.0
ROOT = Path(__file__).resolve().parents[2]
# The system test that boots the demo under systemd in nspawn and storms it.
STORM_TEST = ("tests/system/test_newcomer.py", "under_systemd")


@dataclasses.dataclass
class Kill:
    target: str
    point: str
    env: str = ""
    in_flight: bool = False     # the request was still outstanding at the kill
    back_s: float = 0.0
    reclaim_s: float = 0.0
    ended: str = ""             # how the in-flight episode ended
    missed: int = 0             # tries whose target had exited before the kill
    forked: int = 0             # forks of the episode live at the kill
    unforkable: str = ""        # what its environment refused to fork (not_forkable)
    fork_full: bool = False     # the chain ended at the service's capacity (429)
    problems: list[str] = dataclasses.field(default_factory=list)


def plan(envs: list[Env], kills: int, rng: random.Random) -> list[tuple[str, Env, str]]:
    """(target, environment, point) for every kill: the points of each
    target cycle in a shuffled order, so a short storm still spreads. The
    helper's kills go round the environments whose episodes need it (a
    sandbox or a container it made)."""
    work: list[tuple[str, Env, str]] = []
    needs_helper = [e for e in envs if e.sandboxes or e.containers]
    targets: list[tuple[str, list[Env]]] = [("helper", needs_helper or envs)]
    targets += [("service", [e]) for e in envs]
    targets += [("worker", [e]) for e in envs]
    targets += [("grader", [e]) for e in envs if e.finish and e.grader]
    for target, choices in targets:
        orders = {}
        for env in choices:
            # A grading child exists only while grading; a standing grader
            # process is there at every point.
            only_grading = target == "grader" and env.grader != "process"
            orders[env.name] = list(("grading",) if only_grading else env.points)
            rng.shuffle(orders[env.name])
            if target == "service" and orders[env.name][0] == "reset":
                # its first kill comes past the reset, with forks of the
                # episode live (killstorm_forks): a short storm has one too
                orders[env.name].append(orders[env.name].pop(0))
        # The helper at least once per environment that needs it.
        for i in range(max(kills, len(choices)) if target == "helper" else kills):
            env = choices[i % len(choices)]
            order = orders[env.name]
            work.append((target, env, order[(i // len(choices)) % len(order)]))
    return work


def _what(target: str, env: Env | None, name: str) -> str:
    if target == "helper":
        return "camg-helper"
    if target == "service":
        return f"camg-{name}"
    if target == "worker":
        return f"camg-{name}'s worker"
    return f"camg-{name}'s {env.grader_name if env else 'grader'}"


def summarize(done: list[Kill], kills: int, envs: list[Env] | None = None) -> list[Row]:
    by_name = {e.name: e for e in envs or []}
    rows = []
    groups: dict[tuple[str, str], list[Kill]] = {}
    for k in done:
        key = ("helper", "all") if k.target == "helper" else (k.target, k.env)
        groups.setdefault(key, []).append(k)
    for (target, env), ks in groups.items():
        what = _what(target, by_name.get(env), env)
        points = ", ".join(f"{p} {sum(1 for k in ks if k.point == p)}" for p in POINTS
                           if any(k.point == p for k in ks))
        if target == "helper":
            points += "; " + ", ".join(f"{n} {sum(1 for k in ks if k.env == n)}"
                                       for n in sorted({k.env for k in ks}))
        problems = [p for k in ks for p in k.problems]
        missed = sum(k.missed for k in ks)
        ends: dict[str, int] = {}
        for k in ks:
            label = k.ended.split(" (")[0] if k.ended else "-"
            ends[label] = ends.get(label, 0) + 1
        counted = (f"back max {max(k.back_s for k in ks):.1f}s; reclaimed max "
                   f"{max(k.reclaim_s for k in ks):.1f}s (<= {RECLAIM_S:.0f}s); records parse; "
                   f"{sum(k.in_flight for k in ks)} with a request in flight, the episode: "
                   + ", ".join(f"{n}x {e}" for e, n in sorted(ends.items())))
        if missed:
            counted += f"; {missed} tries repeated (the target finished before the kill)"
        forked = sum(k.forked for k in ks)
        if forked:
            counted += f"; {forked} forks live at {sum(1 for k in ks if k.forked)} kill(s)"
        full = sum(k.fork_full for k in ks)
        if full:
            counted += f"; the fork chain reached capacity (429) at {full} kill(s)"
        refused = sorted({k.unforkable for k in ks if k.unforkable})
        if refused and not forked:
            counted += f"; forks skipped: not_forkable ({', '.join(refused)})"
        if problems:
            counted += f"; {len(problems)} problem(s), first: {problems[0][:200]}"
        wanted = max(kills, len({k.env for k in ks})) if target == "helper" else kills
        rows.append(Row("kill storm", env, f"kill -9 {what} x{len(ks)} ({points})", counted,
                        not problems and len(ks) == wanted))
    return rows


def rows(kills: int = 3, seed: int = 0, lock: str | None = None) -> list[Row]:
    """Run the storm's system test (it installs the demo in a fresh nspawn
    machine under systemd, then storms it) and return its rows: what the
    reliability runner calls. ``lock``: a flock file to hold while it runs
    (the shared machine's /tmp/camg-privileged.lock); never one the caller
    already holds."""
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}killstorm-") as tmp:
        report = Path(tmp) / "rows.json"
        env = {**os.environ, "CAMG_KILLSTORM_KILLS": str(kills), "CAMG_KILLSTORM_SEED": str(seed),
               "CAMG_KILLSTORM_REPORT": str(report)}
        argv = [sys.executable, "-m", "pytest", STORM_TEST[0], "-k", STORM_TEST[1], "-q", "-s",
                "-p", "no:cacheprovider"]
        result = subprocess.run((["flock", lock] if lock else []) + argv, cwd=ROOT, env=env)
        if not report.exists():
            return [Row("kill storm", "-", f"{kills} kills per target",
                        f"the system test did not report (pytest exit {result.returncode})", False)]
        return [Row(**r) for r in json.loads(report.read_text())]
