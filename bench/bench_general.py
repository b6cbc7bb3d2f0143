#!/usr/bin/env python3
"""Benchmark of the General service against plain Docker, in one run.

    sudo .venv/bin/python bench/bench_general.py [--n 30] [--interval 3] [--json OUT]

Needs the Coding demo set cached under $CAMG_CACHE/coding (the Coding tests
or bench build it) and the system dockerd. Builds General's demo images
(cached), publishes them to a loopback registry, starts a private helper
with the container mediator, and a real ``python -m camg.serve`` General
service with a fake judge. Measures, on one opensource-code task image:

* reset (POST /episodes) with the warm pool (claims paced at --interval so
  the pool and each container's prewarm can keep up), and without a pool;
* step (POST /episodes/{id}/step, a ``true`` shell action) through the
  service, helper socket and in-container transport;
* baselines on the same image: ``docker run --rm --network none`` of
  ``true`` and ``docker exec`` of ``true`` in a running container.

Ratios are taken within this run. Everything it creates is labelled with
its own scope and removed at the end.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camg_client import Client  # noqa: E402
from tools.harness import container_image as ci  # noqa: E402
from tools.harness.helpers import HelperProcess, helper_config, private_base  # noqa: E402
from tools.harness.services import ServiceProcess, clean_git_tree, free_port  # noqa: E402
from tools.judge_stub import FakeJudge  # noqa: E402
from tools.loopback_registry import LocalRegistry  # noqa: E402

CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))


def note(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def summary(samples: list[float]) -> dict:
    ms = sorted(x * 1000 for x in samples)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(p99, 2)}


def coding_demo() -> Path:
    found = sorted((CACHE / "coding").glob("demo-*/tasks.jsonl"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit("no Coding demo set under $CAMG_CACHE/coding: run the Coding tests first")
    return found[-1].parent


def start_helper(refs: list[str], agent_env: Path) -> HelperProcess:
    """A private helper with the container mediator, its own scope and cgroup parents."""
    base = private_base("bench-general")
    manifest = ci.write_manifest(base / "images.json", refs)
    cfg = helper_config(base, [str(CACHE / "helper")], [], name="bench-general",
                        probe_on_start=False,
                        containers=ci.containers_config(
                            manifest, scope=f"bench-{os.getpid()}", agent_env_source=str(agent_env),
                            containers_per_peer=64, max_memory_bytes=2 << 30))
    return HelperProcess.start(base, cfg, wait_probes=False, owner="bench", owns_base=True)


def start_service(work: Path, prepared: Path, helper: HelperProcess, judge: FakeJudge, pool: int):
    from camg.configure import configure

    work.mkdir(parents=True)
    lock = work / "requirements.lock"
    lock.write_text("openai==3.57.0\n")
    (work / "deployment.json").write_text(json.dumps({
        "runtime_lock": str(lock), "state_root": str(work / "state"), "helper_socket": helper.socket,
        "environments": {"general": {
            "manifest": str(prepared / "manifest.json"), "port": free_port(), "capacity": 16,
            "settings": {"pool_size": pool, "cpu": 1.0, "memory_bytes": 1 << 30}}}}))
    configure(work / "deployment.json", work / "prepared", source_tree=clean_git_tree(work / "src"))
    env = {"GA_JUDGE_URL": judge.url, "GA_JUDGE_MODEL": "bench", "GA_JUDGE_KEY": "bench-key"}
    return ServiceProcess(work / "prepared" / "general.json", env=env).wait_ready(timeout=600)


def bench_service(service, task_id: str, n: int, interval: float, steps: int) -> dict:
    client = Client(service.url)
    resets, step_times = [], []
    for i in range(n):
        t0 = time.perf_counter()
        episode = client.create(task_id=task_id)
        resets.append(time.perf_counter() - t0)
        if i < steps:
            for _ in range(5):
                t1 = time.perf_counter()
                client.step(episode["episode_id"], {"operation": "shell", "command": "true"})
                step_times.append(time.perf_counter() - t1)
        client.close(episode["episode_id"])
        time.sleep(interval)
    meta = client.metadata()
    return {"reset": summary(resets), "step": summary(step_times) if step_times else None,
            "pool": meta.get("pool")}


def bench_docker(image: str, agent_env: Path, scope: str, n: int) -> dict:
    label = f"camg.helper={scope}"
    mount = f"{agent_env}:/opt/camg/agent-env:ro"
    run = ["docker", "run", "--rm", "--init", "--network", "none", "--label", label, "-v", mount,
           image, "true"]
    subprocess.run(run, check=True, capture_output=True)
    runs = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(run, check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    cid = subprocess.run(["docker", "run", "-d", "--init", "--network", "none", "--label", label,
                          "-v", mount, image, "sleep", "infinity"], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        execs = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["docker", "exec", cid, "true"], check=True, capture_output=True)
            execs.append(time.perf_counter() - t0)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return {"docker_run_rm_true": summary(runs), "docker_exec_true": summary(execs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=10, help="episodes whose 5 steps are timed")
    ap.add_argument("--json")
    args = ap.parse_args()
    from daemons.general.prepare import prepare_general
    from tools.general import agent_env, demo

    work = Path(tempfile.mkdtemp(prefix="camg-bench-general-"))
    registry = LocalRegistry(work / "registry").start()
    helper = judge = None
    services = []
    try:
        note("building the demo set and agent environment (cached)")
        built = demo.build(CACHE, coding_demo(), registry.address, work / "demo")
        env_dir = agent_env.cached(CACHE)
        prepared = work / "prepared"
        prepare_general(code_rows=str(built["code_rows"]), general_rows=None, envs=None,
                        images=str(built["images"]), output_dir=prepared)
        task = json.loads((prepared / "manifest.json").read_text())["tasks"][0]
        helper = start_helper(built["refs"], env_dir)
        judge = FakeJudge().start()
        results = {}
        for pool, label in ((2, "with_pool"), (0, "without_pool")):
            note(f"service {label}")
            service = start_service(work / label, prepared, helper, judge, pool)
            services.append(service)
            time.sleep(10 if pool else 0)  # let the pool fill and prewarm
            results[label] = bench_service(service, task["task_id"], args.n,
                                           args.interval if pool else 0.0, args.steps)
            service.stop()
        note("docker baselines")
        results["docker"] = bench_docker(task["data"]["image"], env_dir, helper.scope, args.n)
        results["ratios"] = {
            "reset_pool_p50_over_docker_run_p50": round(
                results["with_pool"]["reset"]["p50_ms"] / results["docker"]["docker_run_rm_true"]["p50_ms"], 3),
            "reset_nopool_p50_over_docker_run_p50": round(
                results["without_pool"]["reset"]["p50_ms"] / results["docker"]["docker_run_rm_true"]["p50_ms"], 3),
            "step_p50_over_docker_exec_p50": round(
                results["with_pool"]["step"]["p50_ms"] / results["docker"]["docker_exec_true"]["p50_ms"], 3),
        }
        print(json.dumps(results, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    finally:
        for service in services:
            service.stop()
        if judge is not None:
            judge.stop()
        if helper is not None:
            helper.stop()
        api = ci.docker_api()
        for ref in (built["refs"] if "built" in locals() else []):
            ci.remove_image(api, ref)
        api.close()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
