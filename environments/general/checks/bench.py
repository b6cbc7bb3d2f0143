#!/usr/bin/env python3
"""Benchmark of the General service against plain Docker, in one run.

    sudo .venv/bin/python -m environments.general.checks.bench \
        [--n 30] [--interval 3] [--memory-episodes 3]
        [--live 256] [--concurrent-starts N] [--json OUT]

Needs the Coding demo set cached under $CAMG_CACHE/coding (the Coding tests
or bench build it) and the system dockerd. Builds General's demo images
(cached), publishes them to a loopback registry, starts a private helper
with the container mediator, and a real ``python -m camg.serve`` General
service with a fake judge. Measures, on one opensource-code task image:

* reset (POST /episodes) with the warm pool (claims paced at --interval so
  the pool and each container's prewarm can keep up), and without a pool;
* step (POST /episodes/{id}/step, a ``true`` shell action) through the
  service, helper socket and in-container transport;
* memory per live episode (--memory-episodes of them, one at a time): the
  episode container's memory cgroup, read on the host (usage_in_bytes, and
  memory.stat's rss/cache with the kernel's share), idle after reset,
  during a ``sleep 1`` shell step (sampled, and the cgroup's peak over the
  step), and the verifier's own peak over the finish, reported apart; with
  the resident processes' RSS inside the container;
* --live episodes at once (created together on a service whose capacity
  is --live): errors, the time for all the resets, their p50/p99, what the
  containers hold then (per container, and the host's MemAvailable drop per
  episode: docker's shims and everything else outside the cgroups too), and
  one ``true`` step on every live episode;
* baselines on the same image: ``docker run --rm --network none`` of
  ``true``, ``docker exec`` of ``true`` in a running container, and that
  container's own memory cgroup (``sleep infinity`` under docker-init).

Ratios are taken within this run. Everything it creates is labelled with
its own scope and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
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

from camg_client import AsyncClient, Client, ServiceError
from devtools.harness import census
from devtools.harness import container_image as ci
from devtools.harness.auth import deployment_auth
from devtools.harness.helpers import HelperProcess, helper_config, private_base
from devtools.harness.services import ServiceProcess, clean_git_tree, free_port
from tools.judge_stub import FakeJudge
from tools.loopback_registry import LocalRegistry

ROOT = Path(__file__).resolve().parents[3]

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


def start_helper(
    refs: list[str], agent_env: Path, containers: int = 64, concurrent_starts: int = 0
) -> HelperProcess:
    """A private helper with the container mediator, its own scope and cgroup
    parents, holding up to ``containers`` of ours; ``concurrent_starts``
    creates/starts at once (0: the helper's default)."""
    extra = {"concurrent_starts": concurrent_starts} if concurrent_starts else {}
    base = private_base("bench-general")
    manifest = ci.write_manifest(base / "images.json", refs)
    cfg = helper_config(
        base,
        [str(CACHE / "helper")],
        [],
        name="bench-general",
        probe_on_start=False,
        containers=ci.containers_config(
            manifest,
            scope=f"bench-{os.getpid()}",
            agent_env_source=str(agent_env),
            containers_per_peer=containers,
            containers_total=max(512, containers),
            max_memory_bytes=2 << 30,
            **extra,
        ),
    )
    return HelperProcess.start(base, cfg, wait_probes=False, owner="bench", owns_base=True)


def start_service(
    work: Path,
    prepared: Path,
    helper: HelperProcess,
    judge: FakeJudge,
    pool: int,
    capacity: int = 16,
):
    from camg.configure import configure

    work.mkdir(parents=True)
    lock = work / "requirements.lock"
    lock.write_text("openai==3.57.0\n")
    (work / "deployment.json").write_text(
        json.dumps(
            {
                "auth": deployment_auth(),
                "runtime_lock": str(lock),
                "state_root": str(work / "state"),
                "helper_socket": helper.socket,
                "environments": {
                    "general": {
                        "manifest": str(prepared / "manifest.json"),
                        "port": free_port(),
                        "capacity": capacity,
                        # a finish runs the verifier; --live containers boot together on 2 cores
                        "limits": {
                            "action_timeout_s": 1900.0,
                            "reset_timeout_s": 1800.0,
                            "idle_ttl_s": 3600.0,
                        },
                        "settings": {
                            "pool_size": pool,
                            "cpu": 1.0,
                            "memory_bytes": 1 << 30,
                            "connect_timeout_s": 1200.0,
                        },
                    }
                },
            }
        )
    )
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
    return {
        "reset": summary(resets),
        "step": summary(step_times) if step_times else None,
        # the environment's metadata is merged under "hashes" (camg/serving/service.py)
        "pool": meta.get("pool") or (meta.get("hashes") or {}).get("pool"),
    }


# -- memory per live episode ------------------------------------------------------

MIB = 1 << 20


def cgroup_of(container_id: str) -> Path | None:
    """The memory cgroup of a container (a full id or a unique prefix)."""
    for parent in census.MEMORY_CGROUP_PARENTS:
        found = sorted(parent.glob(f"{container_id}*")) if parent.is_dir() else []
        if len(found) == 1:
            return found[0]
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_memory(cg: Path) -> dict | None:
    """Bytes the cgroup holds: ``usage`` (what the kernel charges it, page
    cache and kernel memory included), ``rss`` (anonymous), ``cache`` (page
    cache and tmpfs), ``kernel`` (slab, stacks, page tables), ``peak`` (the
    high-water mark since the last reset_peak); None once it is gone."""
    v1 = (cg / "memory.usage_in_bytes").exists()
    try:
        stat = dict(
            (k, int(v))
            for k, v in (line.split() for line in (cg / "memory.stat").read_text().splitlines())
        )
    except (OSError, ValueError):
        return None
    if v1:
        usage = _read_int(cg / "memory.usage_in_bytes")
        return {
            "usage": usage,
            "rss": stat.get("rss", 0) + stat.get("rss_huge", 0),
            "cache": stat.get("cache", 0),
            "kernel": _read_int(cg / "memory.kmem.usage_in_bytes"),
            "peak": _read_int(cg / "memory.max_usage_in_bytes"),
        }
    return {
        "usage": _read_int(cg / "memory.current"),
        "rss": stat.get("anon", 0),
        "cache": stat.get("file", 0),
        "kernel": stat.get("kernel", 0),
        "peak": _read_int(cg / "memory.peak"),
    }


def reset_peak(cg: Path) -> bool:
    """Start the cgroup's high-water mark afresh (cgroup v1, as root)."""
    try:
        (cg / "memory.max_usage_in_bytes").write_text("0")
        return True
    except OSError:
        return False


def _proc_kib(pid: int) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Name", "RssAnon", "RssFile", "RssShmem"):
                out[key] = value.strip() if key == "Name" else int(value.split()[0])
    except OSError:
        pass
    return out


def processes(cg: Path) -> list[dict]:
    """The processes in the cgroup with their resident KiB (host view)."""
    try:
        pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []
    out = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        cmd = " ".join(a.decode(errors="replace") for a in argv if a)[:100]
        out.append({"pid": pid, "cmd": cmd, **_proc_kib(pid)})
    return out


def _mib(v: int | None) -> float | None:
    return None if v is None else round(v / MIB, 1)


def _mib_dict(m: dict | None) -> dict | None:
    return None if m is None else {k: _mib(v) for k, v in m.items()}


def _during(cg: Path, url: str, episode_id: str, action: dict, every: float) -> tuple:
    """Run one step in a thread while sampling the cgroup: (answer or the
    error, the samples' largest usage, the cgroup's peak, the step's seconds).
    The peak is the last one read: a finish may remove the container."""
    result: dict = {}

    def run() -> None:
        t0 = time.perf_counter()
        try:
            result["answer"] = Client(url).step(episode_id, action)
        except (ServiceError, OSError) as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"[:300]
        result["seconds"] = time.perf_counter() - t0

    reset_peak(cg)
    worker = threading.Thread(target=run, name="bench-step")
    worker.start()
    top = peak = 0
    while worker.is_alive():
        m = cgroup_memory(cg)
        if m is not None:
            top, peak = max(top, m["usage"] or 0), max(peak, m["peak"] or 0)
        time.sleep(every)
    worker.join()
    m = cgroup_memory(cg)
    if m is not None:
        top, peak = max(top, m["usage"] or 0), max(peak, m["peak"] or 0)
    return result.get("answer", result.get("error")), top, peak, result["seconds"]


def bench_memory(service, task_id: str, episodes: int) -> dict:
    """One episode at a time: its container's memory idle after reset,
    during a ``sleep 1`` step, and over the finish (the verifier)."""
    client = Client(service.url)
    rows = []
    for i in range(episodes):
        episode = client.create(task_id=task_id)
        eid = episode["episode_id"]
        short = client.get(eid)["environment_state"]["container"]
        cg = cgroup_of(short)
        if cg is None:
            raise RuntimeError(f"no memory cgroup for container {short}")
        time.sleep(1.0)  # settled: the reset's answer is out
        idle = cgroup_memory(cg)
        procs = processes(cg)
        _, step_top, step_peak, _ = _during(
            cg, service.url, eid, {"operation": "shell", "command": "sleep 1"}, 0.05
        )
        answer, fin_top, fin_peak, fin_s = _during(
            cg, service.url, eid, {"operation": "finish"}, 0.02
        )
        try:  # the helper's reading at the terminal step (the container's whole life)
            cost = client.get(eid).get("cost") or {}
        except ServiceError:
            cost = {}
        try:
            client.close(eid)
        except ServiceError:
            pass  # ended by its finish
        rows.append(
            {
                "idle": idle,
                "step_sampled": step_top,
                "step_peak": step_peak,
                "verifier_peak": fin_peak,
                "verifier_sampled": fin_top,
                "finish_s": round(fin_s, 1),
                "lifetime_peak_helper": cost.get("memory_peak_bytes"),
                "finish": {k: answer.get(k) for k in ("reward", "done", "failure_class")}
                if isinstance(answer, dict)
                else answer,
                "processes": procs,
            }
        )
        note(
            f"memory episode {i + 1}/{episodes}: idle {_mib(idle['usage'])} MiB, step peak "
            f"{_mib(step_peak)} MiB, verifier peak {_mib(fin_peak)} MiB"
        )

    def med(key, sub=None):
        values = [(r[key][sub] if sub else r[key]) or 0 for r in rows]
        return {"median_mib": _mib(int(statistics.median(values))), "max_mib": _mib(max(values))}

    return {
        "episodes": episodes,
        "idle_usage": med("idle", "usage"),
        "idle_rss": med("idle", "rss"),
        "idle_cache": med("idle", "cache"),
        "idle_kernel": med("idle", "kernel"),
        "step_usage_sampled": med("step_sampled"),
        "step_peak": med("step_peak"),
        "verifier_peak": med("verifier_peak"),
        "verifier_usage_sampled": med("verifier_sampled"),
        "lifetime_peak_helper_mib": [_mib(r["lifetime_peak_helper"]) for r in rows],
        "finish_s": [r["finish_s"] for r in rows],
        "finish": rows[0]["finish"],
        "processes_first_episode": rows[0]["processes"],
    }


def host_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) << 10
    return 0


def bench_live(service, scope: str, task_id: str, n: int) -> dict:
    """``n`` episodes created at once and all live together: errors, the
    time for all the resets, what their containers hold, one step each."""
    available_before = host_available()
    errors: list[str] = []

    async def run() -> dict:
        async with AsyncClient(service.url, timeout=1800, max_connections=n + 8) as client:

            async def create() -> tuple[str | None, float]:
                t0 = time.perf_counter()
                try:
                    eid = (await client.create(task_id=task_id, wait=600))["episode_id"]
                except (ServiceError, OSError) as exc:
                    errors.append(f"create: {type(exc).__name__}: {exc}"[:300])
                    eid = None
                return eid, time.perf_counter() - t0

            started = time.perf_counter()
            made = await asyncio.gather(*(create() for _ in range(n)))
            wall = time.perf_counter() - started
            ids = [eid for eid, _ in made if eid]
            await asyncio.sleep(2.0)  # settled
            ours = census.running_containers(scope)
            held = [m for m in (cgroup_memory(cg) for cg in map(cgroup_of, ours) if cg) if m]
            available_live = host_available()

            async def step(eid: str) -> float | None:
                t0 = time.perf_counter()
                try:
                    await client.step(eid, {"operation": "shell", "command": "true"})
                    return time.perf_counter() - t0
                except (ServiceError, OSError) as exc:
                    errors.append(f"step: {type(exc).__name__}: {exc}"[:300])
                    return None

            steps = [s for s in await asyncio.gather(*(step(eid) for eid in ids)) if s is not None]
            await asyncio.gather(*(client.close(eid) for eid in ids), return_exceptions=True)
        total = {k: sum(m[k] or 0 for m in held) for k in ("usage", "rss", "cache", "kernel")}
        each = {f"{k}_mib_each": _mib(v // max(1, len(held))) for k, v in total.items()}
        return {
            "asked": n,
            "live": len(ids),
            "errors": len(errors),
            "first_errors": errors[:3],
            "resets_wall_s": round(wall, 1),
            "reset": summary([s for e, s in made if e]) if ids else None,
            "containers": len(held),
            "containers_total_mib": _mib(total["usage"]),
            **each,
            "host_memavailable_drop_mib_each": _mib(
                (available_before - available_live) // max(1, len(ids))
            ),
            "step_each_once": summary(steps) if steps else None,
        }

    return asyncio.run(run())


def bench_docker(image: str, agent_env: Path, scope: str, n: int) -> dict:
    label = f"camg.helper={scope}"
    mount = f"{agent_env}:/opt/camg/agent-env:ro"
    run = [
        "docker",
        "run",
        "--rm",
        "--init",
        "--network",
        "none",
        "--label",
        label,
        "-v",
        mount,
        image,
        "true",
    ]
    subprocess.run(run, check=True, capture_output=True)
    runs = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(run, check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    cid = subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--init",
            "--network",
            "none",
            "--label",
            label,
            "-v",
            mount,
            image,
            "sleep",
            "infinity",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        execs = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["docker", "exec", cid, "true"], check=True, capture_output=True)
            execs.append(time.perf_counter() - t0)
        time.sleep(1.0)
        cg = cgroup_of(cid)
        bare = cgroup_memory(cg) if cg else None
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return {
        "docker_run_rm_true": summary(runs),
        "docker_exec_true": summary(execs),
        # the same image's container doing nothing (docker-init, sleep)
        "bare_container_mib": _mib_dict(bare),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=10, help="episodes whose 5 steps are timed")
    ap.add_argument(
        "--memory-episodes",
        type=int,
        default=3,
        help="episodes whose container memory is read idle, stepping and finishing",
    )
    ap.add_argument("--live", type=int, default=256, help="episodes live at once (0: skip)")
    ap.add_argument("--live-pool", type=int, default=2, help="the --live service's pool_size")
    ap.add_argument(
        "--concurrent-starts",
        type=int,
        default=0,
        help="the helper's containers.concurrent_starts (0: its default, 8); the "
        "Docker API timeout is the helper's default (60 s)",
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from environments.general.build import agent_env
    from environments.general.demo import assemble as demo
    from environments.general.prepare import prepare_general

    work = Path(tempfile.mkdtemp(prefix="camg-bench-general-"))
    registry = LocalRegistry(work / "registry").start()
    helper = judge = None
    services = []
    try:
        note("building the demo set and agent environment (cached)")
        built = demo.build(CACHE, coding_demo(), registry.address, work / "demo")
        env_dir = agent_env.cached(CACHE)
        prepared = work / "prepared"
        prepare_general(
            code_rows=str(built["code_rows"]),
            general_rows=None,
            envs=None,
            images=str(built["images"]),
            output_dir=prepared,
        )
        task = json.loads((prepared / "manifest.json").read_text())["tasks"][0]
        helper = start_helper(
            built["refs"],
            env_dir,
            containers=max(64, args.live + 16),
            concurrent_starts=args.concurrent_starts,
        )
        judge = FakeJudge().start()
        results = {}
        for pool, label in ((2, "with_pool"), (0, "without_pool")):
            note(f"service {label}")
            service = start_service(work / label, prepared, helper, judge, pool)
            services.append(service)
            time.sleep(10 if pool else 0)  # let the pool fill and prewarm
            results[label] = bench_service(
                service, task["task_id"], args.n, args.interval if pool else 0.0, args.steps
            )
            if pool and args.memory_episodes:
                note(f"memory of {args.memory_episodes} episodes (idle, stepping, finishing)")
                time.sleep(10)  # the pool refilled and prewarmed again
                results["memory"] = bench_memory(service, task["task_id"], args.memory_episodes)
            service.stop()
        if args.live:
            note(f"{args.live} live episodes at once")
            service = start_service(
                work / "live", prepared, helper, judge, args.live_pool, capacity=max(16, args.live)
            )
            services.append(service)
            time.sleep(10 if args.live_pool else 0)
            results["live"] = bench_live(service, helper.scope, task["task_id"], args.live)
            with helper.client() as h:  # the gate's peak and slots taken over the whole run
                results["live"]["helper_container_starts"] = h.ping().get("container_starts")
            note(
                f"live: {results['live']['live']}/{args.live}, errors {results['live']['errors']}, "
                f"resets {results['live']['resets_wall_s']} s, "
                f"{results['live']['usage_mib_each']} MiB each"
            )
            service.stop()
        note("docker baselines")
        results["docker"] = bench_docker(task["data"]["image"], env_dir, helper.scope, args.n)
        results["ratios"] = {
            "reset_pool_p50_over_docker_run_p50": round(
                results["with_pool"]["reset"]["p50_ms"]
                / results["docker"]["docker_run_rm_true"]["p50_ms"],
                3,
            ),
            "reset_nopool_p50_over_docker_run_p50": round(
                results["without_pool"]["reset"]["p50_ms"]
                / results["docker"]["docker_run_rm_true"]["p50_ms"],
                3,
            ),
            "step_p50_over_docker_exec_p50": round(
                results["with_pool"]["step"]["p50_ms"]
                / results["docker"]["docker_exec_true"]["p50_ms"],
                3,
            ),
        }
        bare = (results["docker"].get("bare_container_mib") or {}).get("usage")
        if bare and "memory" in results:
            results["ratios"]["idle_memory_median_over_bare_container"] = round(
                results["memory"]["idle_usage"]["median_mib"] / bare, 2
            )
        if bare and "live" in results:
            results["ratios"]["live_memory_each_over_bare_container"] = round(
                results["live"]["usage_mib_each"] / bare, 2
            )
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
        for ref in built["refs"] if "built" in locals() else []:
            ci.remove_image(api, ref)
        api.close()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
