"""Churn: many episodes through a real service, ended every way an episode
ends, then a census that must find nothing left.

Each episode: reset → 1-3 cheap actions → one of
  * finish   — actions until the step budget ends it (graded),
  * close    — DELETE,
  * abandon  — never touched again: the lease reaper must end it.
Beside them, on an environment whose plugin forks, a small fork tree and
a worker kill -9 with forks live (devtools/reliability/churn_forks.py).
Afterwards (service still running, then stopped): no sandbox in the
helper's ledger, no upper, cgroup, process or host mount of a sandbox, no
fork layer, no container or fork snapshot image, and nothing in the state
directory beyond one outcome record and one trajectory per episode.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from camg_client import AsyncClient, ServiceError
from devtools.reliability import churn_forks
from devtools.reliability.rig import state_strays
from devtools.reliability.service import Prepared
from devtools.reliability.table import Row

BUDGET = 4  # max_steps: "finish" episodes end by the budget, as any would
IDLE_TTL = 2.0
WORKERS = 8
SETTLE_S = 15.0


async def _episode(client: AsyncClient, action: dict, mode: str, rng: random.Random) -> str:
    created = await client.create(wait=600)
    eid = created["episode_id"]
    for _ in range(BUDGET if mode == "finish" else rng.randint(1, BUDGET - 1)):
        answer = await client.step(eid, action)
        if answer["done"]:
            break
    if mode == "close":
        await client.close(eid)
    return eid


async def _churn(url: str, action: dict, n: int, seed: int,
                 forks: churn_forks.Forks) -> tuple[set[str], list[str]]:
    modes = ["finish", "close", "abandon"]
    ids: set[str] = set()
    errors: list[str] = []
    queue = list(range(n))
    async with AsyncClient(url, timeout=900) as client:
        async def worker(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            while queue:
                i = queue.pop()
                try:
                    ids.add(await _episode(client, action, modes[i % 3], rng))
                except (ServiceError, OSError) as exc:
                    errors.append(f"episode {i}: {exc}")
        await asyncio.gather(*(worker(w) for w in range(WORKERS)),
                             churn_forks.tree(client, action, BUDGET, forks))
        # The reaper ends the abandoned ones within a lease and a tick.
        deadline = time.monotonic() + IDLE_TTL * 10 + 60
        while time.monotonic() < deadline:
            if (await client.request("GET", "/episodes"))["active"] == 0:
                break
            await asyncio.sleep(0.5)
    return ids, errors


def _pooled(prepared: Prepared) -> int:
    """The warm pool's started, never-used containers stay while it serves."""
    return prepared.rig.pooled if prepared.rig else 0


def _held(census: dict[str, int], prepared: Prepared) -> bool:
    return any(v for k, v in census.items() if k != "containers") \
        or census["containers"] > _pooled(prepared)


def run(prepared: Prepared, n: int, seed: int = 0) -> Row:
    target, helper = prepared.target, prepared.helper
    limits = {"idle_ttl_s": IDLE_TTL, "max_steps": BUDGET}
    forks = churn_forks.Forks()
    with prepared.serve(capacity=max(WORKERS, 16), limits=limits) as service:
        ids, errors = asyncio.run(_churn(service.url, target.action, n, seed, forks))
        if forks.refused is None and not forks.problems:
            # a service that serves only a state directory checked clean
            # (the rig's pre_serve) stops when its worker dies
            restart = prepared.restart if prepared.rig and prepared.rig.pre_serve else None
            asyncio.run(churn_forks.kill_with_forks_live(service, target.action, forks, restart))
        # An episode leaves the table before its close has released
        # everything (AutoResearch unmounts a disk upper): a few seconds.
        settle = time.monotonic() + SETTLE_S
        running = helper.census()
        while _held(running, prepared) and time.monotonic() < settle:
            time.sleep(0.2)
            running = helper.census()
        state = Path(service.config["state_dir"])
    stopped = helper.census()
    records = [json.loads(line) for line in (state / "outcomes.jsonl").read_text().splitlines()]
    churned = len(ids)
    ids |= forks.ids
    churn_forks.check_records(records, forks)
    strays = state_strays(state, ids, target.state_files, target.state_dirs, records)
    by = {s: sum(1 for r in records if r["status"] == s) for s in ("done", "closed")}
    reaped = sum(1 for r in records if r["reason"] == "lease expired")
    pooled = _pooled(prepared)
    running["containers"] = max(0, running["containers"] - pooled)
    leaks = {k: v for k, v in stopped.items() if v} | {
        f"{k} (while serving)": v for k, v in running.items() if v}
    ok = (not errors and not forks.problems and not leaks and not strays
          and len(records) == len(ids) and churned == n and reaped >= n // 3)
    counted = (f"{len(records)} records ({by['done']} done, {by['closed']} closed, {reaped} reaped); "
               f"{forks.summary()}; leaks {leaks or 0}; strays {len(strays)}; errors {len(errors)}"
               + (f"; {pooled} warm pool containers while serving" if pooled else ""))
    if errors:
        counted += f"; first error: {errors[0][:200]}"
    if forks.problems:
        counted += f"; {len(forks.problems)} fork problem(s), first: {forks.problems[0][:200]}"
    if strays:
        counted += f"; first strays: {', '.join(strays[:3])}"
    return Row("churn", target.name, f"{n} episodes (finish/close/abandon) + forks", counted, ok)
