#!/usr/bin/env python3
"""Benchmark of forking a container (the helper's ContainerFork, issue 26)
against a fresh container reset, in one run.

    sudo .venv/bin/python bench/bench_fork_containers.py [--n 20] [--pool 4] [--json OUT]

On the system dockerd and the small test image (bench_containers.py's:
the cached Debian minbase, by digest from a loopback registry), p50/p99 of:
  * fork: ContainerFork of a running container whose server answers on a
    port, then connect + one request to the child's own server (processes
    are not carried: the child's starts afresh, as General's transport
    does), after the parent wrote 0, 1 MB and 100 MB (--written) into its
    filesystem; with the helper's split (create_s: a child made now, ~0
    with a standby; copy_s: the parent paused while its upper is copied;
    start_s; commit_s on a storage driver without an upper to copy) and
    how many forks took a standby child (helper/container_standby.py)
  * reset without a pool: ContainerCreate + connect + request
  * reset with the warm pool: claim + connect + request (claims paced)
Ratios within this run. The goal (issue 26): fork p50 <= 500 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_containers import (CACHE, PORT, bench_no_pool, bench_pool, note, request,  # noqa: E402
                              start_helper, summary)
from camg.sandboxes.containers import ContainerClient, ContainerSpec  # noqa: E402
from devtools.harness import container_image as ci  # noqa: E402
from tools.loopback_registry import LocalRegistry  # noqa: E402


def bench_fork(cc: ContainerClient, spec: ContainerSpec, n: int, written: int) -> dict:
    parent = cc.create(spec, episode_id="bench-parent")
    children: list[str] = []
    try:
        request(cc, parent.id)
        if written:
            r = cc.exec(parent.id, f"head -c {written} /dev/urandom > /tmp/written && sync", user="root",
                        timeout=120)
            if r.exit_code != 0:
                raise RuntimeError(r.output)
        totals: list[float] = []
        split: dict[str, list[float]] = {}
        hits = 0
        for i in range(n):
            t0 = time.perf_counter()
            reply = cc.fork_reply(parent.id, episode_id=f"bench-child-{i}")
            request(cc, reply["container_id"])
            totals.append(time.perf_counter() - t0)
            for key in ("commit_s", "create_s", "copy_s", "start_s"):
                if key in reply:
                    split.setdefault(key, []).append(reply[key])
            hits += bool(reply.get("standby"))
            children.append(reply["container_id"])
            # one live child at a time (the next fork's standby is made meanwhile)
            cc.remove(children.pop())
        out = {"fork": summary(totals), "standby_hits": hits}
        for key, values in split.items():
            out[key.replace("_s", "_p50_ms")] = round(statistics.median(values) * 1000, 2)
        return out
    finally:
        for cid in children:
            cc.remove(cid)
        cc.remove(parent.id)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between pooled resets")
    ap.add_argument("--written", default="0,1000000,100000000", help="bytes the parent writes, per row")
    ap.add_argument("--rootfs", default=str(CACHE / "helper" / "bookworm-minbase"))
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    base = Path(tempfile.mkdtemp(prefix=f"camg-bench-fork-registry-{os.getpid()}-"))
    registry = LocalRegistry(base).start()
    api = ci.docker_api()
    helper = None
    results: dict = {}
    try:
        image = ci.publish_test_image(api, Path(args.rootfs), registry.address, "camg-bench/fork")
        helper = start_helper(image)
        cc = ContainerClient(helper.socket, owner="bench")
        cc.pull(image)
        spec = ContainerSpec(image=image, cpu=1.0, memory_bytes=512 << 20, pids_max=128,
                             command=("perl", "-e", ci.PERL_SERVER, str(PORT)))
        results = {"image": image, "n": args.n, "pool_size": args.pool}
        note("reset without a pool")
        results["reset_no_pool"] = bench_no_pool(cc, spec, args.n)
        note("reset with the warm pool")
        results["reset_pool"] = bench_pool(cc, spec, args.n, args.pool, args.interval)["reset"]
        for written in [int(w) for w in args.written.split(",")]:
            note(f"fork after {written} bytes written")
            results[f"fork_written_{written}"] = bench_fork(cc, spec, args.n, written)
        ratios = {}
        for key in [k for k in results if k.startswith("fork_written_")]:
            p50 = results[key]["fork"]["p50_ms"]
            ratios[f"{key}_p50_over_reset_no_pool_p50"] = round(p50 / results["reset_no_pool"]["p50_ms"], 3)
            ratios[f"{key}_p50_over_reset_pool_p50"] = round(p50 / results["reset_pool"]["p50_ms"], 3)
        results["ratios"] = ratios
        results["goal_fork_p50_le_500ms"] = {k: results[k]["fork"]["p50_ms"] <= 500.0
                                             for k in results if k.startswith("fork_written_")}
        if cc.list():
            raise RuntimeError(f"containers left: {cc.list()}")
        cc.close()
    finally:
        if helper is not None:
            helper.stop()
        if "image" in locals():
            ci.remove_image(api, image)
        api.close()
        registry.stop()
        shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
