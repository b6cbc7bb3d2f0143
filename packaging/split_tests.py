"""Deal a test directory's modules into shards of about equal time, for
packaging/run-tests.sh's lanes (issue 23: the unit tier run whole after the
system tier was CI's critical path, 1278 s + 466 s).

    python packaging/split_tests.py SHARDS INDEX [DIR]      # the modules of shard INDEX
    python packaging/split_tests.py --record FILE.xml [DIR] # refresh the timings

The timings (seconds per module, from a JUnit file of a whole run) live in
DIR/.durations.json; a module it does not know yet weighs the median, so a
new module never needs the file refreshed to be run. Dealing is greedy,
longest first, to the lightest shard; ties go by name, so every lane of one
checkout deals the same way and each module runs in exactly one shard.
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


def modules(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("test_*.py"))


def timings(directory: Path) -> dict[str, float]:
    try:
        data = json.loads((directory / DURATIONS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def deal(names: list[str], known: dict[str, float], shards: int) -> list[list[str]]:
    if shards < 1:
        raise ValueError("shards must be at least 1")
    default = statistics.median(known.values()) if known else 1.0
    weight = {n: known.get(n, default) for n in names}
    loads = [0.0] * shards
    dealt: list[list[str]] = [[] for _ in range(shards)]
    for name in sorted(names, key=lambda n: (-weight[n], n)):
        lightest = min(range(shards), key=lambda i: (loads[i], i))
        loads[lightest] += weight[name]
        dealt[lightest].append(name)
    return [sorted(s) for s in dealt]


def record(junit: Path, directory: Path) -> dict[str, float]:
    """Seconds per module of ``directory`` from a JUnit file (classnames
    look like tests.unit.test_x or tests.unit.test_x.TestClass)."""
    per: dict[str, float] = defaultdict(float)
    known = set(modules(directory))
    for case in ET.parse(junit).getroot().iter("testcase"):
        for part in (case.get("classname") or "").split("."):
            if f"{part}.py" in known:
                per[f"{part}.py"] += float(case.get("time") or 0.0)
                break
    return {k: round(v, 1) for k, v in sorted(per.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", metavar="FILE.xml")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args(argv)
    if a.record:
        directory = Path(a.args[0] if a.args else "tests/unit")
        (directory / DURATIONS).write_text(json.dumps(record(Path(a.record), directory), indent=1) + "\n")
        return 0
    if len(a.args) not in (2, 3):
        ap.error("SHARDS INDEX [DIR]")
    shards, index = int(a.args[0]), int(a.args[1])
    directory = Path(a.args[2] if len(a.args) == 3 else "tests/unit")
    if not 0 <= index < shards:
        ap.error(f"INDEX must be in 0..{shards - 1}")
    names = modules(directory)
    if not names:
        print(f"split_tests: no test modules in {directory}", file=sys.stderr)
        return 1
    for name in deal(names, timings(directory), shards)[index]:
        print(directory / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
