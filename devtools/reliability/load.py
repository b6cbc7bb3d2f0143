"""Load: N concurrent episodes stepping for a bounded time on loopback.

Every episode is created first (all N live at once, each with its own
sandbox where the environment uses them), then each steps a cheap action
in a loop until the deadline. Counted: errors (any HTTP error or
failure_class), step latency p50/p99, the service's and helper's peak
memory. The service runs at its default capacity when that is at least N
(see camg.config.service_config: the default derives from what the helper can hold), so
the run also shows the default holds.
"""

from __future__ import annotations

import asyncio
import time

from camg_client import AsyncClient, Client, ServiceError
from devtools.reliability.rig import container_memory
from devtools.reliability.service import Prepared, service_rss_kib
from devtools.reliability.table import Row


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3 if s else float("nan")


async def _load(url: str, action: dict, n: int, seconds: float, on_live) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    async with AsyncClient(url, timeout=600, max_connections=n + 8) as client:
        async def create() -> str | None:
            try:
                return (await client.create(wait=300))["episode_id"]
            except (ServiceError, OSError) as exc:
                errors.append(f"create: {exc}")
                return None

        started = time.monotonic()
        ids = [eid for eid in await asyncio.gather(*(create() for _ in range(n))) if eid]
        created_s = time.monotonic() - started
        live = on_live()
        deadline = time.monotonic() + seconds
        steps = renewed = 0
        last: list[str] = []

        async def stepper(eid: str) -> None:
            nonlocal steps, renewed
            while time.monotonic() < deadline:
                t = time.perf_counter()
                try:
                    answer = await client.step(eid, action)
                except (ServiceError, OSError) as exc:
                    errors.append(f"step: {exc}")
                    break
                steps += 1
                if answer.get("failure_class"):
                    errors.append(f"step ended the episode: {answer['failure_class']}")
                    break
                if not answer["done"]:
                    latencies.append(time.perf_counter() - t)
                    continue
                # The environment's own step budget ended it (graded): keep
                # N live with a fresh episode; the grading step is not a
                # step latency.
                renewed += 1
                try:
                    eid = (await client.create(wait=300))["episode_id"]
                except (ServiceError, OSError) as exc:
                    errors.append(f"create: {exc}")
                    return
            last.append(eid)

        await asyncio.gather(*(stepper(eid) for eid in ids))
        await asyncio.gather(*(client.close(eid) for eid in last), return_exceptions=True)
    return {"created": len(ids), "create_s": created_s, "live": live, "steps": steps,
            "renewed": renewed, "errors": errors,
            "p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99)}


def run(prepared: Prepared, n: int, seconds: float, asked: int | None = None) -> Row:
    """At the environment's default capacity (the deployment names none),
    or the target's load_capacity where it sets one.
    ``asked``: the suite's size, when the target supports fewer at once
    (Target.load_max; the row says why)."""
    target, helper = prepared.target, prepared.helper
    limits = {"max_steps": 1_000_000, "idle_ttl_s": 600}
    with prepared.serve(capacity=target.load_capacity, limits=limits) as service:
        capacity = Client(service.url).metadata()["capacity"]
        helper_before = helper.rss_kib()
        memory: list[tuple[int, int]] = []

        def live() -> int:
            if helper.scope:  # Docker-backed: what the containers hold
                memory.append(container_memory(helper.scope))
            return helper.census()["ledger"]
        r = asyncio.run(_load(service.url, target.action, n, seconds, live))
        service_kib = service_rss_kib(service)
        helper_kib = helper.rss_kib()
    leaks = {k: v for k, v in helper.census().items() if v}
    ok = not r["errors"] and r["created"] == n and capacity >= n and not leaks
    which = "set" if target.load_capacity else "default"
    counted = (f"{which} capacity {capacity}; {r['created']}/{n} live, {r['steps']} steps "
               f"({r['renewed']} episodes ended by their step budget and replaced), "
               f"errors {len(r['errors'])}, "
               f"step p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms, "
               f"service peak RSS {service_kib // 1024} MiB, helper RSS "
               f"{helper_before // 1024}->{helper_kib // 1024} MiB, "
               f"sandboxes live {r['live']}, created in {r['create_s']:.1f} s; "
               + (f"{memory[0][0]} containers holding {memory[0][1] >> 20} MiB "
                  f"({memory[0][1] // max(1, memory[0][0]) >> 20} MiB each); " if memory else "")
               + f"left after stop {leaks or 0}")
    if r["errors"]:
        counted += f"; first error: {r['errors'][0][:200]}"
    done = f"{n} concurrent episodes stepping {seconds:g} s"
    if asked and asked > n:
        done += f" ({asked} asked; at most {n} here: {target.load_why})"
    return Row("load", target.name, done, counted, ok)
