"""Forks in the churn (issue 26): a small fork tree beside the churn's
episodes, and a kill -9 of the service's worker with forks live.

The tree, on an environment whose plugin forks::

    a ─ step ─ fork b ─ step ─ fork c (a fork of a fork) ─ step ─ finish by budget
     └─ fork d ─ fork e
    close a, then b (parents closed before their children); d and e are
    abandoned to the lease reaper

then, after the churn, ``f`` forked into ``g``, ``g`` into ``h``, and the
worker killed with all three live: the replacement worker's recovery
records each (reward null, infra, recovered; the children with their
fork fields) and the master's release before the respawn returns their
sandboxes, layers, containers and snapshot images (camg/serve.py), which
the churn's census then requires to be gone.

A fork the environment refuses (409 ``not_forkable``) skips the rest of
it, by name: it is what that environment promises, not a failure. Any
other error answer (a 503 infra among them) is a problem of the row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import httpx

from camg.sandboxes.census import children_of
from camg_client import AsyncClient, ServiceError

KILL_WAIT_S = 300.0


class Refused(Exception):
    """The environment answered ``not_forkable``: the fork part is skipped."""


@dataclasses.dataclass
class Forks:
    #: every episode the fork part made (parents and children)
    ids: set[str] = dataclasses.field(default_factory=set)
    #: child id -> (parent id, fork_step the service answered)
    children: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    #: the environment's refusal, "what: message" (None: it forks)
    refused: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    #: episodes live in the worker when it was killed
    killed: set[str] = dataclasses.field(default_factory=set)
    #: the service stopped itself after the kill and was started again
    restarted: bool = False
    #: seconds the tree and the kill (to every record and 404) took
    tree_s: float = 0.0
    kill_s: float = 0.0

    def summary(self) -> str:
        if self.refused is not None and not self.children:
            return f"forks skipped: not_forkable ({self.refused[:120]})"
        text = f"{len(self.children)} forks (chains, forks of forks, parents closed first, " \
               f"children reaped; {self.tree_s:.0f} s), {len(self.killed)} live at a worker " \
               f"kill -9 ({self.kill_s:.0f} s" \
            + ("; the service stopped itself, restarted)" if self.restarted else ")")
        if self.refused is not None:
            text += f"; then refused: not_forkable ({self.refused[:120]})"
        return text


async def _fork(client: AsyncClient, forks: Forks, parent: str, steps: int) -> str:
    try:
        child = await client.fork(parent, wait=600)
    except ServiceError as exc:
        if exc.name == "not_forkable":
            what = (exc.body.get("details") or {}).get("what") if isinstance(exc.body, dict) else ""
            raise Refused(f"{what or '-'}: {exc}") from None
        raise
    cid = child["episode_id"]
    forks.ids.add(cid)
    forks.children[cid] = (parent, child.get("fork_step"))
    if child.get("forked_from") != parent or child.get("fork_step") != steps:
        forks.problems.append(f"fork of {parent} at step {steps} answered forked_from "
                              f"{child.get('forked_from')}, fork_step {child.get('fork_step')}")
    return cid


async def _create(client: AsyncClient, forks: Forks) -> str:
    eid = (await client.create(wait=600))["episode_id"]
    forks.ids.add(eid)
    return eid


class Held:
    """The episodes a trainer still means to use, their leases renewed
    (GET /episodes/{id}) every ``RENEW_S``: a fork of a container costs
    seconds, more than the churn's 2 s lease, and the lease reaper must end
    only what is abandoned on purpose."""

    RENEW_S = 0.5

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.ids: set[str] = set()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Held":
        self._task = asyncio.create_task(self._renew())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _renew(self) -> None:
        while True:
            for eid in list(self.ids):
                try:
                    await self.client.request("GET", f"/episodes/{eid}")
                except (ServiceError, OSError, httpx.TransportError):
                    pass  # ended, or the worker is being replaced: the tree says which
            await asyncio.sleep(self.RENEW_S)


async def tree(client: AsyncClient, action: dict, budget: int, forks: Forks) -> None:
    """The fork tree above, run beside the churn's workers."""
    started = time.monotonic()
    async with Held(client) as held:
        try:
            a = await _create(client, forks)
            held.ids.add(a)
            await client.step(a, action)
            b = await _fork(client, forks, a, 1)
            held.ids.add(b)
            await client.step(b, action)
            c = await _fork(client, forks, b, 2)
            held.ids.add(c)
            d = await _fork(client, forks, a, 1)
            held.ids.add(d)
            await client.close(a)
            await client.step(c, action)
            await client.close(b)
            for _ in range(budget):
                if (await client.step(c, action))["done"]:
                    break
            else:
                forks.problems.append(f"fork {c} did not end by the step budget")
            await _fork(client, forks, d, 1)
            # d and its child are abandoned: the reaper's
            held.ids.clear()
        except Refused as exc:
            forks.refused = str(exc)
        except (ServiceError, OSError, httpx.TransportError) as exc:
            forks.problems.append(f"fork tree: {exc}")
    forks.tree_s = time.monotonic() - started


def _uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def _worker(service) -> int | None:
    """The service's worker (where the episodes live): the master's child
    of its own uid (AutoResearch's private grader runs as another)."""
    mine = _uid(service.proc.pid)
    workers = [p for p in children_of({service.proc.pid}) if _uid(p) == mine]
    return max(workers) if workers else None


async def kill_with_forks_live(service, action: dict, forks: Forks, restart=None):
    """f, its fork g and g's fork h live; kill -9 the worker; the
    replacement answers 404 for all three and has recorded each.
    ``restart(service)``: a new service on the same config, for one that
    stopped itself (Prepared.restart); returns the service serving now."""
    live: list[str] = []
    started = time.monotonic()
    async with AsyncClient(service.url, timeout=900) as client:
        try:
            async with Held(client) as held:
                held.ids = live  # the same list: each is held once made
                live.append(await _create(client, forks))
                await client.step(live[0], action)
                live.append(await _fork(client, forks, live[0], 1))
                live.append(await _fork(client, forks, live[1], 1))
        except (Refused, ServiceError, OSError, httpx.TransportError) as exc:
            if isinstance(exc, Refused):
                forks.refused = str(exc)
            else:
                forks.problems.append(f"forks before the kill: {exc}")
            # no kill: what was made ends the ordinary way
            for eid in live:
                await _close_quietly(client, eid)
            return service
        worker = _worker(service)
        if worker is None:
            forks.problems.append("no worker to kill")
            return service
        what = _cmdline(worker)
        os.kill(worker, signal.SIGKILL)
        forks.killed = set(live)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            recorded = {r["episode_id"]: r for r in service.outcomes() if r["episode_id"] in live}
            if len(recorded) == len(live) and await _gone(client, live):
                break
            if service.proc.poll() is not None:
                if restart is None:
                    forks.problems.append(f"the service exited {service.proc.returncode} after "
                                          f"the kill -9 of its worker ({what})")
                    return service
                # AutoResearch stops itself when its worker dies (a new worker
                # may not claim a state directory not checked clean): start it
                # again as systemd would, on the same port
                forks.restarted = True
                service = await asyncio.to_thread(restart, service)
                continue
            await asyncio.sleep(0.5)
        else:
            forks.problems.append(f"after the worker's kill -9, not all of {live} were recorded "
                                  f"and 404 within {KILL_WAIT_S:.0f} s")
            return service
    for eid in live:
        r = recorded[eid]
        if r["reward"] is not None or r["failure_class"] != "infra" or not r.get("recovered"):
            forks.problems.append(f"record of {eid} after the kill: reward {r['reward']}, "
                                  f"class {r['failure_class']}, recovered {r.get('recovered')}")
        if eid in forks.children and r.get("forked_from") != forks.children[eid][0]:
            forks.problems.append(f"recovered record of fork {eid}: forked_from "
                                  f"{r.get('forked_from')}, not {forks.children[eid][0]}")
    forks.kill_s = time.monotonic() - started
    return service


async def _gone(client: AsyncClient, ids: list[str]) -> bool:
    """The replacement worker serves and knows none of ``ids``."""
    for eid in ids:
        try:
            await client.request("GET", f"/episodes/{eid}")
            return False
        except ServiceError as exc:
            if exc.status != 404:
                return False
        except (OSError, httpx.TransportError):
            return False  # no worker listening yet
    return True


async def _close_quietly(client: AsyncClient, eid: str) -> None:
    try:
        await client.close(eid)
    except ServiceError:
        pass  # already ended


def check_records(records: list[dict], forks: Forks) -> None:
    """Every child's outcome record names its parent and fork step."""
    by_id = {r["episode_id"]: r for r in records}
    for cid, (parent, step) in forks.children.items():
        r = by_id.get(cid)
        if r is None:
            forks.problems.append(f"fork {cid}: no outcome record")
        elif r.get("forked_from") != parent or r.get("fork_step") != step:
            forks.problems.append(f"fork {cid}: recorded forked_from {r.get('forked_from')}, "
                                  f"fork_step {r.get('fork_step')}; answered {parent}, {step}")
