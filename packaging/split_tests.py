"""Deal the test tiers' modules into lanes of about equal time, for
packaging/run-tests.sh, which runs the lanes at once.

    python packaging/split_tests.py --lanes N --lane I --tier TIER   # TIER's modules in lane I
    python packaging/split_tests.py --lanes N --plan                 # every lane, with its load
    python packaging/split_tests.py --record FILE.xml...             # refresh the timings

The tiers are the directories tests/system, tests/privileged and
tests/unit. The timings (seconds per module, from the JUnit files of a
whole run) live in each tier's .durations.json; a module a file does not
know yet weighs its tier's median, so a new module never needs the files
refreshed to be run.

Every module is a job of its own, except that the system tier's modules
share one installed guest (tests/system/conftest.py's session fixture,
minutes to build): they stay one job, apart from those in STANDALONE, which
build their own machine. Dealing is greedy, longest job first, to the
lightest lane; ties go by name, so every lane of one checkout deals the
same way and each module runs in exactly one lane.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DURATIONS = ".durations.json"
TESTS = Path(__file__).resolve().parent.parent / "tests"
#: run in this order within a lane: the longest jobs first, the unit modules last
TIERS = ("system", "privileged", "unit")
#: modules of a shared-fixture tier that build everything they need themselves
STANDALONE = {"system": {"test_newcomer.py"}}
SHARED_FIXTURE_TIERS = {"system"}


def modules(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("test_*.py"))


def timings(directory: Path) -> dict[str, float]:
    try:
        data = json.loads((directory / DURATIONS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def deal(names: list[str], known: dict[str, float], shards: int) -> list[list[str]]:
    """One tier's modules into ``shards`` shards of about equal time."""
    jobs = [(known.get(n, _median(known)), (("", n),)) for n in names]
    return [[n for _, n in shard] for shard in _deal(jobs, shards)[0]]


def _median(known: dict[str, float]) -> float:
    return statistics.median(known.values()) if known else 1.0


Job = tuple[float, tuple[tuple[str, str], ...]]  # (seconds, ((tier, module), ...))


def _deal(jobs: list[Job], lanes: int) -> tuple[list[list[tuple[str, str]]], list[float]]:
    if lanes < 1:
        raise ValueError("lanes must be at least 1")
    loads = [0.0] * lanes
    dealt: list[list[tuple[str, str]]] = [[] for _ in range(lanes)]
    for weight, members in sorted(jobs, key=lambda j: (-j[0], j[1])):
        lightest = min(range(lanes), key=lambda i: (loads[i], i))
        loads[lightest] += weight
        dealt[lightest].extend(members)
    return [sorted(lane, key=lambda m: (TIERS.index(m[0]) if m[0] in TIERS else 0, m[1]))
            for lane in dealt], loads


def jobs(tests: Path = TESTS) -> list[Job]:
    """Every tier's modules as jobs, weighed by their recorded seconds."""
    out: list[Job] = []
    for tier in TIERS:
        directory = tests / tier
        names = modules(directory)
        known = timings(directory)
        weight = {n: known.get(n, _median(known)) for n in names}
        if tier in SHARED_FIXTURE_TIERS:
            alone = [n for n in names if n in STANDALONE.get(tier, set())]
            shared = [n for n in names if n not in alone]
            if shared:
                out.append((sum(weight[n] for n in shared), tuple((tier, n) for n in shared)))
            names = alone
        out.extend((weight[n], ((tier, n),)) for n in names)
    return out


def plan(lanes: int, tests: Path = TESTS) -> tuple[list[list[tuple[str, str]]], list[float]]:
    return _deal(jobs(tests), lanes)


def record(junits: list[Path], tests: Path = TESTS) -> dict[str, dict[str, float]]:
    """Seconds per module of each tier from JUnit files (classnames look
    like tests.unit.test_x or tests.unit.test_x.TestClass)."""
    per: dict[str, dict[str, float]] = {tier: defaultdict(float) for tier in TIERS}
    known = {tier: set(modules(tests / tier)) for tier in TIERS}
    for junit in junits:
        for case in ET.parse(junit).getroot().iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
            if tier in per and f"{parts[2]}.py" in known[tier]:
                per[tier][f"{parts[2]}.py"] += float(case.get("time") or 0.0)
    return {tier: {k: round(v, 1) for k, v in sorted(got.items())} for tier, got in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", nargs="+", metavar="FILE.xml")
    ap.add_argument("--lanes", type=int)
    ap.add_argument("--lane", type=int)
    ap.add_argument("--tier", choices=TIERS)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--tests", type=Path, default=TESTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.record:
        for tier, got in record([Path(p) for p in a.record], a.tests).items():
            if got:  # a tier the files did not run keeps its timings
                (a.tests / tier / DURATIONS).write_text(json.dumps(got, indent=1) + "\n")
        return 0
    if a.lanes is None or a.lanes < 1:
        ap.error("--lanes N (at least 1) is needed")
    lanes, loads = plan(a.lanes, a.tests)
    if a.plan:
        for i, (lane, load) in enumerate(zip(lanes, loads)):
            print(f"lane {i}: {load:.0f} s: " + " ".join(f"{t}/{n}" for t, n in lane))
        return 0
    if a.lane is None or a.tier is None or not 0 <= a.lane < a.lanes:
        ap.error(f"--lane (0..{a.lanes - 1}) and --tier are needed")
    for tier, name in lanes[a.lane]:
        if tier == a.tier:
            print(a.tests / tier / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
