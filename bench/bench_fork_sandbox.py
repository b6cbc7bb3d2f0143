#!/usr/bin/env python3
"""ForkSandbox against creating a fresh sandbox, in one run (issue 26).

    sudo .venv/bin/python bench/bench_fork_sandbox.py [--rootfs DIR] [--n 40] [--json OUT]

For each upper kind (tmpfs: Coding; disk: AutoResearch) and each amount the
agent wrote before the fork (1 MB, 100 MB, in files of 1 MiB), measures
through the real client and socket:
  * create: CreateSandbox of a fresh sandbox over the same lowers;
  * fork (freezing): ForkSandbox of a parent holding that much, which wrote
    a small file since its last fork (untimed), so every sample freezes its
    upper into one more layer, up to the depth bound; the parent is then
    made afresh;
  * fork_reuse: ForkSandbox of the same parent left untouched after one
    freezing fork (untimed): the child goes over the parent's stack, no
    new layer (a trainer's group of completions from one prefix), up to 64
    children a parent;
  * fork_squash: the fork past the depth bound of a chain writing at
    every level (8 freezing forks untimed, the ninth squashes the stack and
    that much data into one layer), n/8 samples;
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
from devtools.harness.helpers import start_private  # noqa: E402

WRITTEN = {"1MB": 1, "100MB": 100}
DEPTH = 8  # the helper's default ceilings.fork_depth
GROUP = 64  # untouched forks of one parent (fork_reuse)


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
        for reuse in (False, True):
            forks: list[float] = []
            while len(forks) < n:
                parent = c.create_sandbox(lowers, **spec)
                r = c.exec(parent, f"for i in $(seq {mib}); do head -c 1M /dev/urandom > "
                                   "/tmp/f$i; done; sync", user="agent", timeout=300)
                assert r.exit_code == 0, r.output
                children = []
                if reuse:  # the one freezing fork, untimed
                    children.append(c.fork_sandbox(parent)["sandbox_id"])
                for i in range(min(GROUP if reuse else DEPTH, n - len(forks))):
                    if not reuse:
                        c.exec(parent, f"echo {i} > /tmp/step", user="agent")
                    reply = []
                    forks.append(sample(lambda: reply.append(c.fork_sandbox(parent))))
                    assert reply[0]["reused"] == reuse, reply[0]
                    children.append(reply[0]["sandbox_id"])
                check = c.exec(children[-1], "ls /tmp | grep -c '^f'").output.strip()
                assert check == str(mib), check
                for sid in children + [parent]:
                    c.destroy(sid)
            key = f"fork_{'reuse_' if reuse else ''}{label}"
            out[key] = summary(forks)
            out[key]["ratio_to_create_p50"] = round(out[key]["p50_ms"] / out["create"]["p50_ms"],
                                                    2)
        squashes: list[float] = []
        for _ in range(max(3, n // 8)):
            chain = [c.create_sandbox(lowers, **spec)]
            r = c.exec(chain[0], f"for i in $(seq {mib}); do head -c 1M /dev/urandom > "
                                 "/tmp/f$i; done; sync", user="agent", timeout=300)
            assert r.exit_code == 0, r.output
            for level in range(DEPTH + 1):
                c.exec(chain[-1], f"echo {level} > /tmp/level-{level}", user="agent")
                reply = []
                t = sample(lambda: reply.append(c.fork_sandbox(chain[-1])))
                chain.append(reply[0]["sandbox_id"])
            assert reply[0]["depth"] == 1, reply[0]
            squashes.append(t)
            check = c.exec(chain[-1], "ls /tmp | grep -c '^f'").output.strip()
            assert check == str(mib), check
            for sid in chain:
                c.destroy(sid)
        out[f"fork_squash_{label}"] = summary(squashes)
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
    results: dict = {"load_avg_1m_at_start": round(os.getloadavg()[0], 1)}
    try:
        c = helper.client(pool_size=8)
        for upper in ("tmpfs", "disk"):
            note(f"{upper} uppers")
            results[upper] = bench_kind(c, args.rootfs, upper, args.n)
        c.close()
    finally:
        helper.stop()
    results["goal_fork_p50_le_10ms"] = {
        f"{kind}{reuse}": all(results[kind][f"fork{reuse}_{label}"]["p50_ms"] <= 10.0
                              for label in WRITTEN)
        for kind in ("tmpfs", "disk") for reuse in ("", "_reuse")}
    results["load_avg_1m_at_end"] = round(os.getloadavg()[0], 1)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
