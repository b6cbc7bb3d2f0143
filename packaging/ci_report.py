"""The end of a test run of packaging/run-tests.sh: its streams' JUnit files
read together into the ten slowest tests (setup, call and teardown summed,
so a module's expensive fixture shows on the test that paid for it), each
stream's wall time, every test that failed or errored with the first line
of its message (CI may keep only the end of the output: the names must be
in it), and one closing count line for all of them.

    python packaging/ci_report.py [--slowest N] STREAM=FILE.xml[:SECONDS] ...
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter

#: failed or errored tests named at the end (a broken fixture can fail hundreds)
MAX_BROKEN = 40


def read(path: str) -> tuple[Counter, list[tuple[float, str]], list[str]]:
    """A JUnit file's outcome counts, (seconds, test) pairs and one line per
    failed or errored test."""
    counts: Counter = Counter()
    tests: list[tuple[float, str]] = []
    broken: list[str] = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        counts["error"] += 1  # a stream that wrote no report did not pass
        print(f"ci_report: no report in {path}: {exc}", file=sys.stderr)
        return counts, tests, [f"{path}: no report ({exc})"]
    for case in root.iter("testcase"):
        outcome = "passed"
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                message = (child.get("message") or child.text or "").strip()
                first = message.splitlines()[0][:300] if message else ""
                broken.append(f"{outcome.upper()} {name}: {first}")
                break
            if child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
        tests.append((float(case.get("time") or 0.0), name))
    return counts, tests, broken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slowest", type=int, default=10)
    ap.add_argument("streams", nargs="+", metavar="STREAM=FILE.xml[:SECONDS]")
    args = ap.parse_args(argv)
    total: Counter = Counter()
    everything: list[tuple[float, str]] = []
    broken: list[str] = []
    print(f"{'stream':<14} {'wall':>7}  passed failed error skipped")
    for spec in args.streams:
        name, _, rest = spec.partition("=")
        path, _, wall = rest.partition(":")
        counts, tests, failures = read(path)
        total.update(counts)
        everything += [(t, f"[{name}] {n}") for t, n in tests]
        broken += [f"[{name}] {line}" for line in failures]
        print(f"{name:<14} {wall + ' s' if wall else '?':>7}  {counts['passed']:6d} "
              f"{counts['failed']:6d} {counts['error']:5d} {counts['skipped']:7d}")
    print(f"\n{args.slowest} slowest tests (setup + call + teardown):")
    for seconds, name in sorted(everything, reverse=True)[:args.slowest]:
        print(f"{seconds:9.1f} s  {name}")
    if broken:
        print(f"\n{len(broken)} failed or errored (each stream's log above has the whole report):")
        for line in broken[:MAX_BROKEN]:
            print(f"  {line}")
        if len(broken) > MAX_BROKEN:
            print(f"  ... and {len(broken) - MAX_BROKEN} more")
    # The one closing line for the whole run, in the plain form CI reads.
    print(f"\n{total['passed']} passed, {total['failed'] + total['error']} failed, "
          f"{total['skipped']} skipped")
    return 0 if not (total["failed"] or total["error"]) and total["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
