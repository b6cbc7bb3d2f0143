#!/usr/bin/env python3
"""Light sessions at scale: how many live episodes one service holds, what
each costs in memory, and how steps answer while many stream at once.

    .venv/bin/python -m bench.bench_sessions [--sessions 4096] [--steppers 256]
        [--seconds 20] [--env counter --env shop] [--json bench/results/sessions.json]

Per environment (the counter environment and every registered one whose
episodes run in the service's own process, its plugin's substrate
"process": Shop), one real ``camg.serve`` service with ``capacity`` =
``--sessions``:

* ``hold``: ``--sessions`` episodes created over loopback HTTP (64 creates
  in flight), all live at once; errors counted, the service's resident
  memory (its process tree's VmRSS) before, after the creates and after
  the stepping below, and from those the bytes one session holds;
* ``step``: ``--steppers`` closed-loop clients, each stepping its own live
  episode with no pause, for ``--seconds``; p50/p99 of a step and the
  steps per second. The baseline, in the same run on the same service: one
  client stepping alone (what a step costs without any queue).

Shop's steps alternate a search (four queries, so the searcher's cache
answers most: what search itself costs is environments/shop/checks/bench.py's)
and the way back to the search page. Any other such environment is
prepared and served by its reliability recipe (its plugin's
``reliability``) and steps the recipe's cheap action.

``sessions_per_core`` is the sessions held over the host's cores, beside
OpenEnv's published 256 per core (2,048 concurrent sessions on 8 cores).
By Little's law a closed loop of N clients over a service that completes
X steps per second waits about N / X a step: ``little_ms`` says what the
measured throughput allows, so a p50 far above one step's own cost is the
queue of clients, not the service's slowness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from camg_client import AsyncClient
from devtools.harness.auth import session_token
from devtools.harness.services import ServiceProcess, configure_counter

OPENENV_PER_CORE = 256
CREATES_IN_FLIGHT = 64


def _rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` and its descendants (gunicorn master and worker)."""
    total = 0
    for each in _tree(pid):
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50_ms": round(at(0.50) * 1e3, 3),
            "p99_ms": round(at(0.99) * 1e3, 3), "mean_ms": round(statistics.mean(ordered) * 1e3, 3)}


class _Wire:
    """One keep-alive HTTP/1.1 connection on asyncio streams: the load
    generator's own, tens of microseconds a request, so that what is
    measured is the service and not an HTTP client library."""

    def __init__(self, url: str, token: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.address = (host, int(port))
        self.head = (f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\n").encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(*self.address)
        assert self.reader is not None  # opened with the writer
        data = json.dumps(body).encode()
        self.writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\n" + self.head
                          + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answer = await self.reader.readexactly(length)
        if status >= 400:
            raise RuntimeError(f"{status}: {answer[:200]!r}")
        return json.loads(answer)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], []))
    return out


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of ``pid``'s process tree."""
    total = 0
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def _hold(url: str, n: int, create: dict) -> tuple[list[str], list[str], float]:
    ids: list[str] = []
    errors: list[str] = []
    wires = [_Wire(url, session_token()) for _ in range(CREATES_IN_FLIGHT)]
    todo = iter(range(n))

    async def worker(wire: _Wire) -> None:
        for _ in todo:
            try:
                ids.append((await wire.post("/episodes", create))["episode_id"])
            except Exception as exc:  # counted: the result is how many held
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                wire.close()
                wire.writer = None

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(w) for w in wires))
    finally:
        for wire in wires:
            wire.close()
    return ids, errors, time.perf_counter() - started


async def _steppers(url: str, ids: list[str], count: int, action: Callable[[int], dict],
                    seconds: float) -> tuple[list[float], list[str]]:
    """``count`` closed-loop clients, one connection each; client k steps its
    share of ``ids`` in turn (so no episode nears its step limit), the action
    chosen by that episode's own step count."""
    times: list[float] = []
    errors: list[str] = []
    steps = dict.fromkeys(ids, 0)
    stop = time.perf_counter() + seconds

    async def loop(mine: list[str]) -> None:
        wire = _Wire(url, session_token())
        turn = 0
        try:
            while time.perf_counter() < stop:
                eid = mine[turn % len(mine)]
                turn += 1
                started = time.perf_counter()
                try:
                    await wire.post(f"/episodes/{eid}/step", {"action": action(steps[eid])})
                except Exception as exc:  # counted
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    return
                times.append(time.perf_counter() - started)
                steps[eid] += 1
        finally:
            wire.close()

    await asyncio.gather(*(loop(ids[k::count]) for k in range(min(count, len(ids)))))
    return times, errors


async def _measure(url: str, pid: int, sessions: int, steppers: int, seconds: float,
                   create: dict, action: Callable[[int], dict]) -> dict:
    before = _rss_bytes(pid)
    ids, errors, took = await _hold(url, sessions, create)
    after = _rss_bytes(pid)
    async with AsyncClient(url, token=session_token()) as client:
        held = (await client.health())["episodes"]
    hold = {"asked": sessions, "held": len(ids), "errors": len(errors),
            "first_errors": errors[:3], "create_s": round(took, 2),
            "live_reported": held.get("active"), "rss_before_mb": round(before / 2**20, 1),
            "rss_after_mb": round(after / 2**20, 1),
            "bytes_per_session": round((after - before) / max(1, len(ids)))}
    out: dict = {"hold": hold, "sessions_per_core": round(len(ids) / (os.cpu_count() or 1), 1),
                 "openenv_published_per_core": OPENENV_PER_CORE}
    for key, count, span in (("step_alone", 1, min(5.0, seconds)),
                             ("step_many", steppers, seconds)):
        cpu = _cpu_s(pid)
        times, errs = await _steppers(url, ids, count, action, span)
        cpu = _cpu_s(pid) - cpu
        rate = len(times) / span
        out[key] = {**_percentiles(times), "errors": len(errs), "first_errors": errs[:3],
                    "clients": count, "steps_per_s": round(rate, 1),
                    # the service's own CPU a step, its process tree's
                    "service_cpu_ms_per_step": round(cpu / max(1, len(times)) * 1e3, 3),
                    "little_ms": round(count / rate * 1e3, 2) if rate else None}
    # after every episode stepped: what sessions holding pages cost
    stepped = _rss_bytes(pid)
    hold["rss_after_steps_mb"] = round(stepped / 2**20, 1)
    hold["bytes_per_session_after_steps"] = round((stepped - before) / max(1, len(ids)))
    many = out["step_many"]
    out["goals"] = {"held_all_without_error": len(ids) == sessions and not errors,
                    "step_p50_le_2ms": many["p50_ms"] <= 2.0,
                    "step_p99_le_50ms": many["p99_ms"] <= 50.0}
    return out


def _counter(tmp: Path, capacity: int) -> tuple[Path, dict, Callable[[int], dict]]:
    tasks = [{"task_id": "t0", "data": {"target": 10**9}}]
    limits = {"idle_ttl_s": 3600.0}
    return (configure_counter(tmp, tasks=tasks, capacity=capacity, limits=limits),
            {"task_id": "t0"}, lambda i: {"operation": "guess", "value": i % 1000})


def _shop(tmp: Path, capacity: int) -> tuple[Path, dict, Callable[[int], dict]]:
    from devtools.harness import shop

    config = shop.configure_service(tmp, capacity=capacity)
    queries = ("red shoes", "wireless headphones", "coffee maker", "yoga mat")

    def action(i: int) -> dict:
        # a search, then back to the search page: each a real page step
        if i % 2:
            return {"action": "click[back to search]"}
        return {"action": f"search[{queries[(i // 2) % len(queries)]}]"}

    return config, {}, action


def _from_recipe(name: str) -> Callable[[Path, int], tuple[Path, dict, Callable[[int], dict]]]:
    """``name`` as its reliability recipe prepares and configures it, stepping
    the recipe's cheap action (one that never ends the episode)."""
    def subject(tmp: Path, capacity: int) -> tuple[Path, dict, Callable[[int], dict]]:
        from devtools.reliability.targets import configure, recipes

        target = recipes()[name]
        if target.missing or target.prepare is None:
            raise SystemExit(f"{name}: {target.missing or 'its recipe prepares nothing'}")
        prepared = target.prepare(tmp / "data", "")
        config = configure(target, tmp / "service", prepared, "", capacity=capacity,
                           limits={"idle_ttl_s": 3600.0})
        return config, {}, lambda i: target.action

    return subject


#: The subjects with steps of their own (the counter's guesses, Shop's pages)
TUNED = {"counter": _counter, "shop": _shop}


def subjects() -> dict[str, Callable[[Path, int], tuple[Path, dict, Callable[[int], dict]]]]:
    """The counter, then every registered environment whose episodes run in
    the service's process (camg.plugins), so a new one is measured without an
    edit here."""
    from camg import plugins

    out = {"counter": TUNED["counter"]}
    for name, plugin in plugins.all_plugins().items():
        if plugin.substrate == "process":
            out[name] = TUNED.get(name) or _from_recipe(name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4096)
    ap.add_argument("--steppers", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    known = subjects()
    ap.add_argument("--env", action="append", choices=sorted(known))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results: dict = {"host": {"cores": os.cpu_count(), "loadavg_start": os.getloadavg()}}
    for name in args.env or list(known):
        with tempfile.TemporaryDirectory(prefix=f"camg-bench-sessions-{name}.") as tmp:
            config, create, action = known[name](Path(tmp), args.sessions)
            service = ServiceProcess(config).wait_ready(timeout=300)
            try:
                results[name] = asyncio.run(_measure(
                    service.url, service.proc.pid, args.sessions, args.steppers, args.seconds,
                    create, action))
            finally:
                service.stop()
        print(json.dumps({name: results[name]}), flush=True)
    results["host"]["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
