"""The code screen's false positives on honest fixes, and its speed.

    .venv/bin/python bench/bench_code_screen.py [--corpus FILE] [--json OUT]

Runs camg.grading.code_screen over every gold fix of the corpus (default: the 877
honest fixes of three real SWE-smith repositories in
tests/unit/data/swesmith_gold_fixes.jsonl.gz, as Coding screens an agent's
diff: the non-test Python it adds or changes, hunks alone) and writes
bench/results/code_screen.json: total, flagged, rate, per-rule counts, each
flagged instance with its rules and lines, wall and CPU time. The goal: at most 1 %
flagged (environments/coding/README.md, "The code screen", lists them).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camg.grading import code_screen  # noqa: E402

CORPUS = ROOT / "tests" / "unit" / "data" / "swesmith_gold_fixes.jsonl.gz"
OUT = ROOT / "bench" / "results" / "code_screen.json"
GOAL_RATE = 0.01


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _is_test(path: str) -> bool:
    # The corpus holds non-test files only; Coding's filter (diff_paths) is
    # the service's, and the benchmark imports no service.
    name = path.rsplit("/", 1)[-1]
    return "/tests/" in f"/{path}" or name.startswith("test_") or name == "conftest.py"


def measure(rows: list[dict]) -> dict:
    flagged, per_rule = [], collections.Counter()
    start, cpu = time.perf_counter(), time.process_time()
    for row in rows:
        findings = code_screen.screen_diff(row["gold_patch"].encode(),
                                           include=lambda p: not _is_test(p))
        if findings:
            flagged.append({"instance_id": row["instance_id"], "repo": row["repo"],
                            "findings": [{"rule": f.rule, "line": f.detail} for f in findings]})
            per_rule.update({f.rule for f in findings})
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    by_repo = collections.Counter(r["repo"] for r in rows)
    return {"total": len(rows), "flagged": len(flagged),
            "rate": round(len(flagged) / len(rows), 5) if rows else 0.0,
            "goal_rate": GOAL_RATE, "goal_met": len(flagged) <= GOAL_RATE * len(rows),
            "per_rule": {rule: per_rule.get(rule, 0) for rule in code_screen.RULES},
            "repos": dict(sorted(by_repo.items())),
            "flagged_fixes": flagged, "wall_s": round(wall, 3),
            # CPU time: what the screen costs, whatever else the host runs
            "cpu_s": round(cpu, 3), "per_fix_cpu_ms": round(cpu * 1000 / max(len(rows), 1), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--json", type=Path, default=OUT)
    args = parser.parse_args()
    result = {"corpus": os.path.relpath(args.corpus, ROOT), **measure(load(args.corpus)),
              "loadavg": [round(x, 2) for x in os.getloadavg()]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "flagged_fixes"}, indent=1))
    for fix in result["flagged_fixes"]:
        for finding in fix["findings"]:
            print(f"{fix['instance_id']}: {finding['rule']}: {finding['line']}")
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
