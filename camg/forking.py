"""``POST /episodes/{id}/fork``: continue one running episode several ways.

The parent must be reset, idle and unfinished. Its environment builds the
child (``Episode.fork``, on a worker thread under the reset deadline) while
the parent's step lock (``Record.busy``) is held, so no step can change
what is being copied; a step or another fork that arrives meanwhile is 409
``episode_busy``, never a wait. The child is an episode like any other:
it takes a slot (429, or a wait in the admission line, as a create), has
its own lease, outcome record, trajectory, metrics and cost, and carries
``forked_from`` and ``fork_step`` (the parent's step count at the fork).

The fork's time is the child's reset time (its ``reset_s`` phase, the
reset histogram of camg.metrics).

What the child inherits is the episode's budget, not a fresh one: its step
count starts at ``fork_step`` (``max_steps`` counts the whole path) and its
wall deadline is the parent's, so forking never buys an episode more steps
or time than one straight run had.

The child's trajectory file starts with a ``fork`` event naming the parent
and the step; the parent's file holds the steps before it
(``trajectory``, below, joins them). A fork the environment refuses
(``NotForkable``) leaves nothing behind: no record, no outcome line, the
slot freed. A fork that fails otherwise is a failed reset of the child:
its outcome record says ``reward: null`` and the failure class, and the
trainer gets a 503 with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from camg import http_wire as wire
from camg.environment import Episode, Environment
from camg.errors import (AtCapacity, DeadlineExceeded, EpisodeBusy, EpisodeDone, EpisodeExists,
                         FailureClass, InfraFailure, NotForkable, Unavailable)
from camg.metrics import task_kind
from camg.outcomes import OutcomeLog

log = logging.getLogger("camg.episodes")


class Episodes(Protocol):
    """What a fork uses of the episode manager (camg.episodes)."""

    env: Environment
    outcomes: OutcomeLog
    records: dict[str, Any]
    finished: Mapping[str, Any]
    admission: Any
    metrics: Any
    limits: Any
    pool: Any

    _stopping: bool

    def _lookup(self, episode_id: str) -> Any: ...

    def on_change(self) -> None: ...

    async def _finish(self, rec: Any, **kwargs: Any) -> dict: ...

    async def _closed_while_created(self, rec: Any) -> None: ...

    def _failure_of(self, exc: BaseException, rec: Any, phase: str) -> FailureClass: ...


class Forker:
    def __init__(self, manager: Episodes) -> None:
        self.manager = manager
        #: parents whose Episode.fork overran its deadline and still runs:
        #: their step lock is held until it returns
        self._overrun: set[str] = set()

    def _refuse(self, parent_id: str, child_id: str | None) -> Any:
        """The parent's record, or the refusal a fork of it gets now."""
        m = self.manager
        if m._stopping:
            raise Unavailable("service is shutting down")
        rec = m._lookup(parent_id)
        if rec.status == "starting":
            raise EpisodeBusy(f"episode {parent_id!r} is still being reset")
        if rec.status != "running":
            raise EpisodeDone(f"episode {parent_id!r} is {rec.status}",
                              terminal=rec.terminal or {"episode_id": parent_id, "done": True})
        if rec.busy:
            raise EpisodeBusy(f"episode {parent_id!r} is running a step or a fork")
        if child_id is not None and (child_id in m.records or child_id in m.finished):
            raise EpisodeExists(f"episode {child_id!r} exists")
        return rec

    async def fork(self, parent_id: str, request: wire.ForkEpisode, hangup=None) -> dict:
        m = self.manager
        self._refuse(parent_id, request.episode_id)  # a 404 or 409 is not worth a wait
        await m.admission.enter(request.wait_s, hangup)
        try:  # the slot is taken (the child's record) before the next await
            # again: while we waited the parent may have stepped, ended or
            # started another fork, and the id may have been taken
            parent = self._refuse(parent_id, request.episode_id)
            child = self._record(request.episode_id or uuid.uuid4().hex, parent)
            m.records[child.episode_id] = child
            parent.busy = True  # the parent's step lock, for Episode.fork
        finally:
            m.admission.wake()  # a slot not taken after all goes to the next waiter
        # Shielded like a step: a trainer that hangs up still gets a
        # recorded child (its lease reaps it), never a half-made one.
        return await asyncio.shield(asyncio.ensure_future(self._fork(parent, child)))

    def _record(self, episode_id: str, parent: Any) -> Any:
        m = self.manager
        child = type(parent)(episode_id, parent.task, parent.seed, m.limits.idle_ttl_s,
                             m.limits.episode_timeout_s)
        # the path's budget goes on, not a new one (see the module's docstring)
        child.deadline = parent.deadline
        child.step_count = child.fork_step = parent.step_count
        child.forked_from = parent.episode_id
        child.observation = parent.observation
        return child

    async def _fork(self, parent: Any, child: Any) -> dict:
        try:
            return await self._make(parent, child)
        finally:
            if parent.episode_id not in self._overrun:
                parent.busy = False

    async def _make(self, parent: Any, child: Any) -> dict:
        m = self.manager
        started = time.monotonic()
        try:
            child.episode = await self._call_fork(parent, child)
        except (NotForkable, AtCapacity):
            # nothing was created: the child never existed (unless a DELETE
            # of its id recorded it meanwhile: then count it, as it ended).
            # AtCapacity: a gate below (the helper's container starts) ran
            # out first; the trainer's 429, as for a create.
            if child.terminal is not None:
                m.metrics.episode_started(task_kind(m.env, child.task))
            m.records.pop(child.episode_id, None)
            m.admission.wake()
            m.on_change()
            raise
        except Exception as exc:  # a failed reset of the child: recorded, the slot freed
            m.metrics.episode_started(task_kind(m.env, child.task))
            if child.terminal is not None:  # closed meanwhile
                await m._closed_while_created(child)
            self._trajectory_head(parent, child)
            failure = m._failure_of(exc, child, "fork")
            await m._finish(child, reward=None, failure=failure, observation={},
                            reason=f"fork failed: {exc}")
            raise InfraFailure(f"fork failed: {exc}", failure_class=failure,
                               episode_id=child.episode_id, task_id=child.task.task_id) from None
        m.metrics.episode_started(task_kind(m.env, child.task))
        if child.terminal is not None:  # a DELETE of the child reached it first
            await m._closed_while_created(child)
        child.timings["reset_s"] = time.monotonic() - started
        m.metrics.reset(child.timings["reset_s"])
        child.status = "running"
        child.touch()
        parent.touch()
        log.info("episode forked from %s at step %d (%.4f s)", parent.episode_id,
                 child.fork_step, child.timings["reset_s"], **child.fields)
        self._trajectory_head(parent, child)
        m.on_change()
        return {"episode_id": child.episode_id, "task_id": child.task.task_id,
                "observation": child.observation, "reward": None, "done": False,
                "lease_expires_at": child.lease_expires_at(),
                "forked_from": parent.episode_id, "fork_step": child.fork_step}

    def _trajectory_head(self, parent: Any, child: Any) -> None:
        # Only once the environment has forked: a refused fork leaves no
        # file (nor an open marker that a restart would record).
        self.manager.outcomes.trajectory(child.episode_id, {
            "event": "fork", "task_id": child.task.task_id, "seed": child.seed,
            "forked_from": parent.episode_id, "fork_step": child.fork_step,
            "observation": child.observation})

    async def _call_fork(self, parent: Any, child: Any) -> Episode:
        """``parent.episode.fork`` on a worker thread under the reset
        deadline; a child that arrives after the deadline is closed, not
        leaked (its sandbox or container would outlive every record)."""
        m = self.manager
        future = m.threads.submit(parent.episode.fork, child.episode_id)
        try:
            episode = await asyncio.wait_for(asyncio.shield(future), m.limits.reset_timeout_s)
        except asyncio.TimeoutError:
            # The environment is still copying the parent: it stays locked
            # until the copy returns, and the late child is closed.
            self._overrun.add(parent.episode_id)
            future.add_done_callback(lambda done: self._late(done, parent))
            raise DeadlineExceeded(f"fork exceeded {m.limits.reset_timeout_s:g} s") from None
        if not isinstance(episode, Episode):
            raise InfraFailure(f"{type(parent.episode).__name__}.fork returned "
                               f"{type(episode).__name__}, not an Episode")
        return episode

    def _late(self, future: asyncio.Future, parent: Any) -> None:
        """On the event loop, once an overrun Episode.fork has returned."""
        self._overrun.discard(parent.episode_id)
        parent.busy = False
        if future.cancelled() or future.exception() is not None:
            return
        late = future.result()
        if callable(getattr(late, "close", None)):
            self.manager.threads.submit(_close_quietly, late)


def _close_quietly(episode: Any) -> None:
    try:
        episode.close()
    except Exception:
        log.exception("closing a child that was forked after its deadline failed")


def trajectory(outcomes: OutcomeLog, episode_id: str,
               read: Callable[[str], list[dict]] | None = None) -> list[dict]:
    """An episode's whole path: for a forked episode, its ancestors' entries
    up to each fork (their ``reset`` and ``step`` events through
    ``fork_step``), then its own (from its ``fork`` event on)."""
    read = read or outcomes._entries
    entries = read(episode_id)
    head = entries[0] if entries else {}
    if head.get("event") != "fork":
        return entries
    before = trajectory(outcomes, str(head["forked_from"]), read)
    step = int(head["fork_step"])
    prefix = [e for e in before if e.get("event") in ("reset", "fork")
              or (e.get("event") == "step" and isinstance(e.get("step"), int) and e["step"] <= step)]
    return prefix + entries
