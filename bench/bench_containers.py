#!/usr/bin/env python3
"""Benchmark of the container substrate against plain Docker, in one run.

    sudo .venv/bin/python bench/bench_containers.py [--n 40] [--pool 4] [--json OUT]

On the system dockerd (/var/run/docker.sock) and one small image (the
cached Debian minbase rootfs, pushed to a loopback registry and pulled back
by digest), measures p50/p99 of:
  * reset with the warm pool: claim a started, never-used container, connect
    to the server inside it (ContainerConnect) and do one request/response;
    claims paced at --interval, the pool refilled in the background; and
    back to back, where the pool drains and misses create on the spot
  * the same without a pool: ContainerCreate + connect + request
  * baselines: `docker run --rm --network none IMAGE true` (CLI) and the SDK's
    create+start (what the helper itself calls)
  * ContainerExec of `true` against `docker exec` (CLI) of the same container
  * ContainerConnect + request alone
Ratios are taken within this run. Everything it creates is labelled with its
own scope and removed at the end (the helper's stop sweep as the backstop).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camg.sandboxes.containers import ContainerClient, ContainerPool, ContainerSpec  # noqa: E402
from devtools.harness import container_image as ci  # noqa: E402
from devtools.harness.helpers import HelperProcess, helper_config, private_base  # noqa: E402
from tools.loopback_registry import LocalRegistry  # noqa: E402

CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
PORT = 8123


def note(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(samples: list[float]) -> dict:
    ms = [x * 1000 for x in samples]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(pct(ms, 0.99), 2)}


def timed(fn, n: int) -> dict:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def start_helper(image: str) -> HelperProcess:
    """A private helper with the container mediator, its own scope and cgroup parents."""
    base = private_base("bench-containers")
    manifest = ci.write_manifest(base / "images.json", [image])
    cfg = helper_config(base, [str(CACHE / "helper")], [], name="bench-containers",
                        probe_on_start=False,
                        containers=ci.containers_config(manifest, scope=f"bench-{os.getpid()}",
                                                        containers_per_peer=64))
    # Its stop sweep removes the scope's containers.
    return HelperProcess.start(base, cfg, wait_probes=False, owner="bench", owns_base=True)


def request(cc: ContainerClient, cid: str) -> None:
    with cc.connect(cid, PORT, timeout=15) as sock:
        sock.sendall(b"ping\n")
        if sock.makefile("rb").readline() != b"echo:ping\n":
            raise RuntimeError("the server inside answered wrongly")


def bench_pool(cc: ContainerClient, spec: ContainerSpec, n: int, size: int, interval: float) -> dict:
    pool = ContainerPool(cc, spec, size=size)
    remover = _Remover(cc)
    try:
        if not pool.wait_full(120):
            raise RuntimeError(f"pool never filled: {pool.last_error}")
        claims, resets = [], []
        for i in range(n):
            t0 = time.perf_counter()
            c = pool.claim(f"bench-{i}")
            t1 = time.perf_counter()
            request(cc, c.id)
            t2 = time.perf_counter()
            claims.append(t1 - t0)
            resets.append(t2 - t0)
            remover.put(c.id)  # the service removes finished episodes off the reset path
            time.sleep(interval)
        return {"reset": summary(resets), "claim": summary(claims), "hits": pool.hits, "misses": pool.misses}
    finally:
        pool.close()
        remover.close()


class _Remover:
    def __init__(self, cc: ContainerClient) -> None:
        self.cc = cc
        self.items: list[str] = []
        self.cond = threading.Condition()
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, cid: str) -> None:
        with self.cond:
            self.items.append(cid)
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.items and not self.done:
                    self.cond.wait()
                if not self.items:
                    return
                cid = self.items.pop(0)
            self.cc.remove(cid)

    def close(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify()
        self.thread.join()


def bench_no_pool(cc: ContainerClient, spec: ContainerSpec, n: int) -> dict:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        c = cc.create(spec, episode_id=f"bench-nopool-{i}")
        request(cc, c.id)
        samples.append(time.perf_counter() - t0)
        cc.remove(c.id)
    return summary(samples)


def bench_docker(image: str, n: int, scope: str) -> dict:
    label = f"camg.helper={scope}"
    run = ["docker", "run", "--rm", "--init", "--network", "none", "--label", label, image, "true"]
    subprocess.run(run, check=True, capture_output=True)
    out = {"docker_run_rm_true": timed(lambda: subprocess.run(run, check=True, capture_output=True), n)}
    api = ci.docker_api()
    ids = []

    def sdk_run() -> None:
        c = api.create_container(image, command=["sleep", "infinity"], labels={"camg.helper": scope},
                                 host_config=api.create_host_config(init=True, network_mode="none"))
        api.start(c["Id"])
        ids.append(c["Id"])
    out["sdk_create_start"] = timed(sdk_run, n)
    for cid in ids:
        api.remove_container(cid, force=True, v=True)
    api.close()
    return out


def bench_exec(cc: ContainerClient, spec: ContainerSpec, n: int) -> dict:
    c = cc.create(spec)
    try:
        cc.exec(c.id, "true")
        out = {"helper_exec_true": timed(lambda: cc.exec(c.id, "true"), n),
               "docker_exec_true": timed(lambda: subprocess.run(["docker", "exec", c.id, "true"], check=True,
                                                                 capture_output=True), n),
               "connect_request": timed(lambda: request(cc, c.id), n)}
    finally:
        cc.remove(c.id)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between pooled resets")
    ap.add_argument("--rootfs", default=str(CACHE / "helper" / "bookworm-minbase"))
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    base = Path(tempfile.mkdtemp(prefix=f"camg-bench-registry-{os.getpid()}-"))
    registry = LocalRegistry(base).start()
    api = ci.docker_api()
    helper = None
    try:
        image = ci.publish_test_image(api, Path(args.rootfs), registry.address, "camg-bench/containers")
        helper = start_helper(image)
        cc = ContainerClient(helper.socket, owner="bench")
        note(f"pulling {image}")
        cc.pull(image)
        spec = ContainerSpec(image=image, cpu=1.0, memory_bytes=256 << 20, pids_max=128,
                             command=("perl", "-e", ci.PERL_SERVER, str(PORT)))
        results = {"image": image, "n": args.n, "pool_size": args.pool, "interval_s": args.interval}
        note("docker baselines")
        results.update(bench_docker(image, args.n, f"bench-{os.getpid()}"))
        note("exec and connect")
        results.update(bench_exec(cc, spec, args.n))
        note("reset without a pool")
        results["reset_no_pool"] = bench_no_pool(cc, spec, args.n)
        note("reset with the warm pool")
        results["reset_pool"] = bench_pool(cc, spec, args.n, args.pool, args.interval)
        note("reset with the warm pool, back to back (the pool drains: misses create on the spot)")
        results["reset_pool_burst"] = bench_pool(cc, spec, args.n, args.pool, 0.0)
        base_run = results["docker_run_rm_true"]["p50_ms"]
        results["ratios"] = {
            "reset_pool_p50_over_docker_run_p50": round(results["reset_pool"]["reset"]["p50_ms"] / base_run, 3),
            "reset_no_pool_p50_over_docker_run_p50": round(results["reset_no_pool"]["p50_ms"] / base_run, 3),
            "helper_exec_p50_over_docker_exec_p50": round(results["helper_exec_true"]["p50_ms"]
                                                          / results["docker_exec_true"]["p50_ms"], 3),
        }
        results["goal_reset_p50_le_20ms"] = results["reset_pool"]["reset"]["p50_ms"] <= 20.0
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
