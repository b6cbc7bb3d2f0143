#!/usr/bin/env python3
"""ForkSandbox against creating a fresh sandbox, in one run (issue 26).

    sudo .venv/bin/python bench/bench_fork_sandbox.py [--rootfs DIR] [--n 40] [--json OUT]

For each upper kind (tmpfs: Coding; disk: AutoResearch) and each amount the
agent wrote before the fork (1 MB, 100 MB, in files of 1 MiB), measures
through the real client and socket:
  * create: CreateSandbox of a fresh sandbox over the same lowers;
  * fork: ForkSandbox of a parent holding that much (each sample forks the
    same parent again, so the parent's stack grows by one layer a sample up
    to the depth bound; the parent is then made afresh);
and the ratio fork/create of the p50s. Children are destroyed outside the
timed part. The goal: fork p50 <= 10 ms, independent of the bytes written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_helper import CACHE, LIMITS, note, pct  # noqa: E402
from tools.harness.helpers import start_private  # noqa: E402

WRITTEN = {"1MB": 1, "100MB": 100}
DEPTH = 8  # the helper's default ceilings.fork_depth


def sample(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def summary(ts: list[float]) -> dict:
    return {"n": len(ts), "p50_ms": round(pct(ts, 0.5), 3), "p99_ms": round(pct(ts, 0.99), 3)}


def bench_kind(c, rootfs: Path, upper: str, n: int) -> dict:
    spec = dict(LIMITS, memory_bytes=512 << 20, upper=upper, upper_bytes=1 << 30)
    lowers = [str(rootfs)]
    for _ in range(5):  # warm the rootfs's dentries and the init binary
        c.destroy(c.create_sandbox(lowers, **spec))
    creates = []
    for _ in range(n):
        sid = []
        creates.append(sample(lambda: sid.append(c.create_sandbox(lowers, **spec))))
        c.destroy(sid[0])
    out = {"create": summary(creates)}
    for label, mib in WRITTEN.items():
        forks: list[float] = []
        while len(forks) < n:
            parent = c.create_sandbox(lowers, **spec)
            r = c.exec(parent, f"for i in $(seq {mib}); do head -c 1M /dev/urandom > /tmp/f$i; "
                               "done; sync", user="agent", timeout=300)
            assert r.exit_code == 0, r.output
            children = []
            for _ in range(min(DEPTH, n - len(forks))):
                reply = []
                forks.append(sample(lambda: reply.append(c.fork_sandbox(parent))))
                children.append(reply[0]["sandbox_id"])
            check = c.exec(children[-1], "ls /tmp | grep -c '^f'").output.strip()
            assert check == str(mib), check
            for sid in children + [parent]:
                c.destroy(sid)
        out[f"fork_{label}"] = summary(forks)
        out[f"fork_{label}"]["ratio_to_create_p50"] = round(
            out[f"fork_{label}"]["p50_ms"] / out["create"]["p50_ms"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rootfs", type=Path, default=CACHE / "helper" / "bookworm-minbase")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the helper builds real sandboxes")
    helper = start_private("bench-fork", [str(args.rootfs.parent)], [str(args.rootfs)],
                           probe_on_start=False)
    results: dict = {}
    try:
        c = helper.client(pool_size=8)
        for upper in ("tmpfs", "disk"):
            note(f"{upper} uppers")
            results[upper] = bench_kind(c, args.rootfs, upper, args.n)
        c.close()
    finally:
        helper.stop()
    results["goal_fork_p50_le_10ms"] = {
        kind: all(results[kind][f"fork_{label}"]["p50_ms"] <= 10.0 for label in WRITTEN)
        for kind in ("tmpfs", "disk")}
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
