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

``POST /episodes`` with ``group: N`` (a GRPO group) is one reset and N-1
forks of it at step 0, answered ``{"group": [first, fork, ...]}``. No
episode starts before all N slots are held: without ``wait_s`` the group
takes N free slots at once or is a 429, holding nothing; with it, the
group waits in the admission line turn after turn, holding each slot it
gets (as a record that has not started), and frees them all if the wait
runs out. One group gathers at a time, so two groups never each hold half
of what they need. If the reset or any fork fails, every episode of the group made so far is
closed (outcome ``closed``, reward null: the trainer never got their ids)
and the create answers that failure; a refusal (``NotForkable``) is the
409 after the first was closed, since which episodes fork is the
environment's to say only once one exists.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from camg.environment import Environment, Episode, Task
from camg.episodes import canaries
from camg.episodes.admission import RETRY_AFTER_S
from camg.episodes.outcomes import OutcomeLog
from camg.episodes.worker_threads import WorkerThreads
from camg.errors import (
    AtCapacity,
    BadRequest,
    DeadlineExceeded,
    EpisodeBusy,
    EpisodeDone,
    EpisodeExists,
    FailureClass,
    InfraFailure,
    NotForkable,
    Unavailable,
)
from camg.metrics import task_kind
from camg.web import http_wire as wire

log = logging.getLogger("camg.episodes")


class Episodes(Protocol):
    """What a fork uses of the episode manager (camg.episodes.manager)."""

    env: Environment
    outcomes: OutcomeLog
    records: dict[str, Any]
    capacity: int
    admission: Any
    metrics: Any
    limits: Any
    threads: WorkerThreads

    _stopping: bool

    # read-only here: the manager's own mapping type may be narrower
    @property
    def finished(self) -> Mapping[str, Any]: ...

    def _lookup(self, episode_id: str) -> Any: ...

    def on_change(self) -> None: ...

    def _refuse_create(self, request: wire.CreateEpisode) -> None: ...

    def pick_task(
        self, task_id: str | None, seed: int | None, variant: str | None = None
    ) -> Task: ...

    def new_record(self, episode_id: str, task: Task, seed: int | None) -> Any: ...

    async def _start(self, rec: Any, request: wire.CreateEpisode) -> dict: ...

    async def close(
        self,
        episode_id: str,
        reason: str = ...,
        failure: FailureClass | None = None,
        outcome: str | None = None,
    ) -> dict: ...

    async def _finish(
        self,
        rec: Any,
        *,
        reward: float | None,
        failure: FailureClass | None,
        observation: Mapping[str, Any],
        reason: str,
        request_id: str | None = None,
        action: Any = None,
        status: str = ...,
        outcome: str | None = None,
    ) -> dict: ...

    async def _closed_while_created(self, rec: Any) -> None: ...

    def _failure_of(self, exc: BaseException, rec: Any, phase: str) -> FailureClass: ...


class Forker:
    def __init__(self, manager: Episodes) -> None:
        self.manager = manager
        #: parents whose Episode.fork overran its deadline and still runs:
        #: their step lock is held until it returns
        self._overrun: set[str] = set()
        #: held by the group that is gathering its slots (``_gather``)
        self._gathering = asyncio.Lock()

    def _refuse(self, parent_id: str, child_id: str | None) -> Any:
        """The parent's record, or the refusal a fork of it gets now."""
        m = self.manager
        if m._stopping:
            raise Unavailable("service is shutting down")
        rec = m._lookup(parent_id)
        if rec.status == "starting":
            raise EpisodeBusy(f"episode {parent_id!r} is still being reset")
        if rec.status != "running":
            raise EpisodeDone(
                f"episode {parent_id!r} is {rec.status}",
                terminal=rec.terminal or {"episode_id": parent_id, "done": True},
            )
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

    async def group(self, request: wire.CreateEpisode, hangup=None) -> dict:
        """``POST /episodes`` with ``group``: see the module's docstring."""
        m = self.manager
        size = int(request.group or 1)
        m._refuse_create(request)
        if request.task_id is not None:
            m.pick_task(request.task_id, 0, request.variant)  # a 404 is not worth a wait
        if size > m.capacity:
            raise BadRequest(f"group of {size} exceeds the service's capacity ({m.capacity})")
        held: list = []  # the group's records so far, each holding its slot
        try:
            if request.wait_s <= 0:
                await self._take(request, size, held, 0.0, hangup)
            else:
                await self._gather(request, size, held, hangup)
        except BaseException:
            self._drop(held)
            raise
        # the time spent gathering was the line's, not the episodes' budget
        now, wall = time.monotonic(), time.time()
        for rec in held:
            rec.started, rec.started_wall = now, wall
            rec.deadline = now + m.limits.episode_timeout_s
            rec.touch()
        # Shielded like a fork: a trainer that hangs up leaves a whole group
        # (their leases reap them) or none, never a part.
        return await asyncio.shield(asyncio.ensure_future(self._group(held[0], held[1:], request)))

    async def _gather(
        self, request: wire.CreateEpisode, size: int, held: list, hangup=None
    ) -> None:
        """Wait in the admission line for the group's slots, holding each
        one taken, until all are held or ``wait_s`` runs out. One group
        gathers at a time: two that each held part of their slots could
        wait on each other for ever."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait_s
        try:
            await asyncio.wait_for(self._gathering.acquire(), request.wait_s)
        except TimeoutError:
            raise AtCapacity(
                f"another group held the line for {request.wait_s:g} s", retry_after=RETRY_AFTER_S
            ) from None
        try:
            while len(held) < size:
                await self._take(request, size, held, max(0.0, deadline - loop.time()), hangup)
        finally:
            self._gathering.release()

    async def _take(
        self, request: wire.CreateEpisode, size: int, held: list, wait_s: float, hangup=None
    ) -> None:
        """One turn in the admission line: with no wait, all the group's
        slots or none (429); with one, as many as are free, held."""
        m = self.manager
        await m.admission.enter(wait_s, hangup)
        try:  # slots are taken (the records) before the next await
            if not held:
                m._refuse_create(request)
            elif m._stopping:  # the first holds the episode_id asked for: not taken by another
                raise Unavailable("service is shutting down")
            free = m.admission._available()  # this caller's slot included
            if request.wait_s <= 0 and free < size:
                raise AtCapacity(
                    f"a group of {size} needs {size} free slots, {free} are free",
                    retry_after=RETRY_AFTER_S,
                    **m.admission.counts(),
                )
            for _ in range(min(free, size - len(held))):
                if held:
                    rec = self._record(uuid.uuid4().hex, held[0])
                else:
                    rec = m.new_record(
                        request.episode_id or uuid.uuid4().hex,
                        m.pick_task(request.task_id, request.seed, request.variant),
                        request.seed,
                    )
                m.records[rec.episode_id] = rec
                held.append(rec)
        finally:
            m.admission.wake()  # slots not taken after all go to the next waiter
        m.on_change()

    async def _group(self, first: Any, children: list, request: wire.CreateEpisode) -> dict:
        m = self.manager
        try:
            answers = [await m._start(first, request)]
        except BaseException:
            self._drop(children)
            raise
        made = [first]
        try:
            for child in children:
                # the trainer does not know these ids yet, but GET /episodes
                # lists them: a step or DELETE of the first may come between forks
                self._refuse(first.episode_id, None)
                child.observation = first.observation
                first.busy = True
                answers.append(await self._fork(first, child))
                made.append(child)
        except BaseException as exc:
            self._drop(children)
            for rec in made:
                if rec.status in ("starting", "running"):
                    await m.close(rec.episode_id, f"closed with its group: {exc}"[:2000])
            raise
        return {"group": answers}

    def _drop(self, children: list) -> None:
        """Free the slots of a group's records that never got an episode."""
        m = self.manager
        for child in children:
            if (
                child.episode is None
                and child.terminal is None
                and m.records.get(child.episode_id) is child
            ):
                del m.records[child.episode_id]  # type: ignore[union-attr]  # `is child` narrowed Any to Any | None
        m.admission.wake()
        m.on_change()

    def _record(self, episode_id: str, parent: Any) -> Any:
        m = self.manager
        child = type(parent)(
            episode_id, parent.task, parent.seed, m.limits.idle_ttl_s, m.limits.episode_timeout_s
        )
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
            await m._finish(
                child, reward=None, failure=failure, observation={}, reason=f"fork failed: {exc}"
            )
            raise InfraFailure(
                f"fork failed: {exc}",
                failure_class=failure,
                episode_id=child.episode_id,
                task_id=child.task.task_id,
            ) from None
        m.metrics.episode_started(task_kind(m.env, child.task))
        if child.terminal is not None:  # a DELETE of the child reached it first
            await m._closed_while_created(child)
        child.timings["reset_s"] = time.monotonic() - started
        m.metrics.reset(child.timings["reset_s"])
        child.status = "running"
        child.touch()
        parent.touch()
        log.info(
            "episode forked from %s at step %d (%.4f s)",
            parent.episode_id,
            child.fork_step,
            child.timings["reset_s"],
            **child.fields,
        )
        self._trajectory_head(parent, child)
        m.on_change()
        return {
            "episode_id": child.episode_id,
            "task_id": child.task.task_id,
            "observation": child.observation,
            "reward": None,
            "done": False,
            "lease_expires_at": child.lease_expires_at(),
            "forked_from": parent.episode_id,
            "fork_step": child.fork_step,
        }

    def _trajectory_head(self, parent: Any, child: Any) -> None:
        # Only once the environment has forked: a refused fork leaves no
        # file (nor an open marker that a restart would record).
        head = {
            "event": "fork",
            "task_id": child.task.task_id,
            "seed": child.seed,
            "forked_from": parent.episode_id,
            "fork_step": child.fork_step,
            "observation": child.observation,
        }
        if child.task.variant is not None:  # a variant's fork is one too
            head["canary"] = canaries.part(child.task.variant, None, None)
        self.manager.outcomes.trajectory(child.episode_id, head)

    async def _call_fork(self, parent: Any, child: Any) -> Episode:
        """``parent.episode.fork`` on a worker thread under the reset
        deadline; a child that arrives after the deadline is closed, not
        leaked (its sandbox or container would outlive every record)."""
        m = self.manager
        future = m.threads.submit(parent.episode.fork, child.episode_id)
        try:
            episode = await asyncio.wait_for(asyncio.shield(future), m.limits.reset_timeout_s)
        except TimeoutError:
            # The environment is still copying the parent: it stays locked
            # until the copy returns, and the late child is closed.
            self._overrun.add(parent.episode_id)
            future.add_done_callback(lambda done: self._late(done, parent))
            raise DeadlineExceeded(f"fork exceeded {m.limits.reset_timeout_s:g} s") from None
        if not isinstance(episode, Episode):
            raise InfraFailure(
                f"{type(parent.episode).__name__}.fork returned "
                f"{type(episode).__name__}, not an Episode"
            )
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


def trajectory(
    outcomes: OutcomeLog, episode_id: str, read: Callable[[str], list[dict]] | None = None
) -> list[dict]:
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
    prefix = [
        e
        for e in before
        if e.get("event") in ("reset", "fork")
        or (e.get("event") == "step" and isinstance(e.get("step"), int) and e["step"] <= step)
    ]
    return prefix + entries
