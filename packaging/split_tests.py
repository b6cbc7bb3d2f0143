"""Deal the test tiers' modules into lanes of about equal time, for
packaging/run-tests.sh, which runs the lanes at once.

    python packaging/split_tests.py --lanes N --lane I --tier TIER   # TIER's modules in lane I
    python packaging/split_tests.py --lanes N --plan                 # every lane, with its load
    python packaging/split_tests.py --tier TIER --under SECONDS      # TIER's light modules
    python packaging/split_tests.py --record FILE.xml...             # refresh the timings

The tiers are the directories tests/system, tests/privileged and
tests/unit. The timings (seconds per module, from the JUnit files of a
whole run) live in each tier's .durations.json; a module a file does not
know yet weighs its tier's median, so a new module never needs the files
refreshed to be run.

Every module is a job of its own, except that a module recorded at more
than SPLIT_OVER seconds is dealt by its top-level test functions and
classes (a canary suite's cases would otherwise hold one lane alone) unless
it says ``SPLIT_BY_TEST = False`` at its top level (its time is a
module-scoped fixture every lane given one of its tests would build again),
and that the system tier's modules share one installed guest
(tests/system/conftest.py's session fixture, minutes to build): they stay
one job, apart from those in STANDALONE, which build their own machine.
Dealing is greedy, longest job first, to the
lightest lane; ties go by name, so every lane of one checkout deals the
same way and each module runs in exactly one lane.
"""

from __future__ import annotations

import argparse
import ast
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
#: a module recorded longer than this is dealt by test function
SPLIT_OVER = 120.0


def modules(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("test_*.py"))


def timings(directory: Path) -> dict[str, float]:
    try:
        data = json.loads((directory / DURATIONS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def module_timings(directory: Path) -> dict[str, float]:
    return {k: v for k, v in timings(directory).items() if "::" not in k}


def test_names(path: Path) -> list[str]:
    """A module's top-level test functions and test classes, as pytest
    collects them (a function's parametrized cases run under its name)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.name
        for node in tree.body
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test")
        )
        or (isinstance(node, ast.ClassDef) and node.name.startswith("Test"))
    ]


def split_by_test(path: Path) -> bool:
    """False when the module says ``SPLIT_BY_TEST = False`` at its top level."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "SPLIT_BY_TEST" for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ):
            return bool(node.value.value)
    return True


def deal(names: list[str], known: dict[str, float], shards: int) -> list[list[str]]:
    """One tier's modules into ``shards`` shards of about equal time."""
    jobs: list[Job] = [(known.get(n, _median(known)), (("", n),)) for n in names]
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
    return [
        sorted(lane, key=lambda m: (TIERS.index(m[0]) if m[0] in TIERS else 0, m[1]))
        for lane in dealt
    ], loads


def jobs(tests: Path = TESTS) -> list[Job]:
    """Every tier's modules (or a long module's tests) as jobs, weighed by
    their recorded seconds."""
    out: list[Job] = []
    for tier in TIERS:
        directory = tests / tier
        names = modules(directory)
        recorded = timings(directory)
        known = module_timings(directory)
        weight = {n: known.get(n, _median(known)) for n in names}
        if tier in SHARED_FIXTURE_TIERS:
            alone = [n for n in names if n in STANDALONE.get(tier, set())]
            shared = [n for n in names if n not in alone]
            if shared:
                out.append((sum(weight[n] for n in shared), tuple((tier, n) for n in shared)))
            names = alone
        for name in names:
            # (a shared-fixture tier's modules each build their own guest: never split)
            split = (
                weight[name] > SPLIT_OVER
                and tier not in SHARED_FIXTURE_TIERS
                and split_by_test(directory / name)
            )
            tests_of = test_names(directory / name) if split else []
            if len(tests_of) < 2:
                out.append((weight[name], ((tier, name),)))
                continue
            # a test the record does not know weighs the module's mean per test
            mean = weight[name] / len(tests_of)
            out.extend(
                (recorded.get(f"{name}::{t}", mean), ((tier, f"{name}::{t}"),)) for t in tests_of
            )
    return out


def light(directory: Path, under: float) -> list[str]:
    """A tier's modules whose recorded time is under ``under`` seconds (an
    unknown one weighs the median, as when dealing)."""
    known = module_timings(directory)
    return [n for n in modules(directory) if known.get(n, _median(known)) < under]


def plan(lanes: int, tests: Path = TESTS) -> tuple[list[list[tuple[str, str]]], list[float]]:
    return _deal(jobs(tests), lanes)


def record(junits: list[Path], tests: Path = TESTS) -> dict[str, dict[str, float]]:
    """Seconds per module of each tier from JUnit files (classnames look
    like tests.unit.test_x or tests.unit.test_x.TestClass), and per test of
    a module longer than SPLIT_OVER (a parametrized test's cases summed)."""
    per: dict[str, dict[str, float]] = {tier: defaultdict(float) for tier in TIERS}
    known = {tier: set(modules(tests / tier)) for tier in TIERS}
    for junit in junits:
        for case in ET.parse(junit).getroot().iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
            if tier not in per or f"{parts[2]}.py" not in known[tier]:
                continue
            module, seconds = f"{parts[2]}.py", float(case.get("time") or 0.0)
            test = parts[3] if len(parts) > 3 else (case.get("name") or "").split("[")[0]
            per[tier][module] += seconds
            per[tier][f"{module}::{test}"] += seconds
    out = {}
    for tier, got in per.items():
        long = {k for k, v in got.items() if "::" not in k and v > SPLIT_OVER}
        out[tier] = {
            k: round(v, 1)
            for k, v in sorted(got.items())
            if "::" not in k or k.split("::")[0] in long
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", nargs="+", metavar="FILE.xml")
    ap.add_argument("--lanes", type=int)
    ap.add_argument("--lane", type=int)
    ap.add_argument("--tier", choices=TIERS)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--under", type=float, metavar="SECONDS")
    ap.add_argument("--tests", type=Path, default=TESTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.record:
        for tier, got in record([Path(p) for p in a.record], a.tests).items():
            if got:  # a tier the files did not run keeps its timings
                (a.tests / tier / DURATIONS).write_text(json.dumps(got, indent=1) + "\n")
        return 0
    if a.under is not None:
        if a.tier is None:
            ap.error("--under needs --tier")
        for name in light(a.tests / a.tier, a.under):
            print(a.tests / a.tier / name)
        return 0
    if a.lanes is None or a.lanes < 1:
        ap.error("--lanes N (at least 1) is needed")
    lanes, loads = plan(a.lanes, a.tests)
    if a.plan:
        for i, (lane, load) in enumerate(zip(lanes, loads, strict=True)):
            print(f"lane {i}: {load:.0f} s: " + " ".join(f"{t}/{n}" for t, n in lane))
        return 0
    if a.lane is None or a.tier is None or not 0 <= a.lane < a.lanes:
        ap.error(f"--lane (0..{a.lanes - 1}) and --tier are needed")
    for tier, name in lanes[a.lane]:
        if tier == a.tier:
            print(f"{a.tests / tier}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
