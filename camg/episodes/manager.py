"""The episode manager: ids, capacity, leases, deadlines, de-duplicated
steps and outcome records, for any ``camg.environment.Environment``.

It lives on the service's event loop; every environment call runs on a
worker thread under a deadline the server enforces. A step is shielded from
the HTTP request that started it, so a trainer that disconnects mid-step
never loses the outcome record: the step completes, the record is written,
and a retry with the same ``request_id`` gets the same answer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import fastjsonschema

from camg.config.service_config import Limits
from camg.config.variants import Mix
from camg.environment import Environment, Episode, Step, Task
from camg.episodes import canaries
from camg.episodes.admission import Admission, default_queue_bound
from camg.episodes.cost import episode_cost
from camg.episodes.forking import Forker
from camg.episodes.null_proof import NullProof
from camg.episodes.outcomes import OutcomeLog
from camg.episodes.regrading import REGRADE_FIELDS, Regrader
from camg.episodes.submissions import SubmissionStore
from camg.episodes.worker_threads import Call, WorkerThreads
from camg.errors import (
    AtCapacity,
    BadRequest,
    CamgError,
    ConfigError,
    EpisodeBusy,
    EpisodeDone,
    EpisodeExists,
    EpisodeNotFound,
    FailureClass,
    InfraFailure,
    InvalidAction,
    PermissionDenied,
    TaskNotFound,
    Unavailable,
)
from camg.logs import episode_fields
from camg.metrics import Metrics, NoMetrics, task_kind
from camg.web import auth
from camg.web import http_wire as wire

log = logging.getLogger("camg.episodes")

_RESPONSE_CACHE = 64  # request ids remembered per episode
_TOMBSTONES = 10_000  # finished episodes kept for GET/DELETE


class Record:
    """Book-keeping of one episode (manager-internal)."""

    def __init__(
        self, episode_id: str, task: Task, seed: int | None, idle_ttl: float, episode_timeout: float
    ) -> None:
        now = time.monotonic()
        self.episode_id = episode_id
        #: the principal whose request made it (camg.web.auth; None: authentication off)
        self.owner = auth.caller_name()
        self.task = task
        self.seed = seed
        self.episode: Episode | None = None
        # Set on the event loop before Episode.close() is dispatched, so a
        # close racing a creation closes the episode exactly once.
        self.episode_closed = False
        self.status = "starting"
        self.started_wall = time.time()
        self.started = now
        self.deadline = now + episode_timeout
        self.idle_ttl = idle_ttl
        self.last_active = now
        self.step_count = 0
        self.busy = False
        self.terminal: dict | None = None
        self.reward: float | None = None
        self.failure_class: str | None = None
        self.responses: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.timings = {"reset_s": 0.0, "steps_s": 0.0, "grade_s": 0.0}
        #: the outcome record's fields a regrade needs (set when it is written)
        self.outcome: dict | None = None
        self.cost: dict | None = None  # the record's cost (camg.episodes.cost), once finished
        #: the latest observation, which a fork's child starts from (camg.episodes.forking)
        self.observation: Any = None
        self.forked_from: str | None = None  # a fork's parent and its step count then
        self.fork_step: int | None = None
        #: evidence of a failure its control proved the submission's (camg.episodes.null_proof)
        self.obstructed: list[str] | None = None
        #: a variant's verdict, once it ended (camg.episodes.canaries)
        self.canary: dict | None = None

    @property
    def fields(self) -> dict:
        return {"extra": episode_fields(self.episode_id, self.task.task_id)}

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def lease_expires_at(self) -> float:
        return round(time.time() + (self.last_active + self.idle_ttl - time.monotonic()), 3)

    def remember(self, request_id: str | None, body: dict) -> None:
        if request_id:
            self.responses[request_id] = body
            while len(self.responses) > _RESPONSE_CACHE:
                self.responses.popitem(last=False)


class EpisodeManager:
    def __init__(
        self,
        environment: Environment,
        *,
        capacity: int,
        limits: Limits,
        config_hash: str,
        outcomes: OutcomeLog,
        on_change: Callable[[], None] | None = None,
        submissions: SubmissionStore | None = None,
        metrics: Metrics | NoMetrics | None = None,
        queue_bound: int | None = None,
        canary_fraction: float = 0.0,
    ) -> None:
        self.env = environment
        self.metrics = metrics or NoMetrics()
        self.capacity = capacity
        self.limits = limits
        self.config_hash = config_hash
        self.outcomes = outcomes
        self.submissions = submissions or SubmissionStore(outcomes.root)
        self.on_change = on_change or (lambda: None)
        self.records: dict[str, Record] = {}
        self.finished: collections.OrderedDict[str, Record] = collections.OrderedDict()
        self.tasks = {t.task_id: t for t in environment.tasks}
        self._order = list(environment.tasks)
        self.mix, self.variant_tasks = self._variants(canary_fraction)
        self._cursor = 0
        self._stopping = False
        # Compiled to Python once: validation is on every step's hot path.
        self._validate = fastjsonschema.compile(dict(environment.action_schema))
        # Enough threads for a running step and an abort per episode.
        self.threads = WorkerThreads(2 * capacity + 4, f"camg-{environment.name}")
        self._detached_tasks: set[asyncio.Task] = set()
        self._grader_hash: str | None = None
        self.regrader = Regrader(self)
        self.forker = Forker(self)
        self.null_proof = NullProof(self)
        self.admission = Admission(
            lambda: self.capacity - self.active(),
            default_queue_bound(capacity) if queue_bound is None else queue_bound,
        )

    # -- helpers ---------------------------------------------------------
    async def call(
        self,
        fn: Callable,
        *args: Any,
        timeout: float | None = None,
        threads: WorkerThreads | None = None,
    ) -> Any:
        """``fn(*args)`` on a worker thread (of ``threads``, else the
        manager's), DeadlineExceeded past ``timeout`` seconds."""
        return await (threads or self.threads).run(fn, *args, timeout=timeout)

    def _variants(self, fraction: float) -> tuple[Mix, dict[str, Task]]:
        """The manifest's impossible variants as tasks (camg.config.variants): each
        its origin's id and data, graded by the variant's material."""
        context = getattr(self.env, "context", None)
        variants = tuple(getattr(context, "variants", ()) or ())
        if variants and not self.env.serves_variants:
            raise ConfigError(
                f"the {self.env.name} environment cannot serve impossible variants, "
                f"and its manifest has {len(variants)}"
            )
        if fraction > 0 and not variants:
            raise ConfigError(f"canary_fraction {fraction:g} needs a manifest with variants")
        tasks = {
            v.variant_id: Task(v.origin, self.tasks[v.origin].data, variant=v) for v in variants
        }
        return Mix(variants, fraction), tasks

    def new_record(self, episode_id: str, task: Task, seed: int | None) -> Record:
        """A fresh episode's book-keeping under this service's limits."""
        return Record(episode_id, task, seed, self.limits.idle_ttl_s, self.limits.episode_timeout_s)

    def _lookup(self, episode_id: str) -> Record:
        rec = self.records.get(episode_id) or self.finished.get(episode_id)
        # another principal's episode is absent, not forbidden: its id tells nothing
        if rec is None or not auth.may_see(rec.owner):
            raise EpisodeNotFound(f"no episode {episode_id!r}")
        return rec

    @staticmethod
    def _operator_only(what: str) -> None:
        if not auth.is_operator():
            raise PermissionDenied(f"{what} is for principals with the operator role")

    def active(self) -> int:
        return sum(1 for r in self.records.values() if r.status in ("starting", "running"))

    def counts(self) -> dict:
        return {
            "active": self.active(),
            "capacity": self.capacity,
            "finished": len(self.finished),
            **self.admission.counts(),
        }

    def pick_task(self, task_id: str | None, seed: int | None, variant: str | None = None) -> Task:
        """The task a create serves: an impossible variant when the trainer
        asks for one or the mix draws one (camg.config.variants), else ``task_id``,
        ``seed``'s task or the next in order. A variant served in the order's
        stead does not advance it."""
        chosen = self.mix.choose(task_id, seed, variant)
        if chosen is not None:
            return self.variant_tasks[chosen.variant_id]
        if task_id is not None:
            try:
                return self.tasks[task_id]
            except KeyError:
                raise TaskNotFound(f"no task {task_id!r} in this service's selection") from None
        if seed is not None:
            return self._order[seed % len(self._order)]
        task = self._order[self._cursor % len(self._order)]
        self._cursor += 1
        return task

    # -- the contract ----------------------------------------------------
    async def create(self, request: wire.CreateEpisode, hangup=None) -> dict:
        """``hangup``: completes when the trainer hangs up (camg.episodes.admission)."""
        if request.group is not None:
            # the other ways in (OpenEnv's reset, MCP sessions) drive one episode each
            raise BadRequest("group is answered by POST /episodes only")
        self._refuse_create(request)
        if request.task_id is not None:
            # a 404 is not worth a wait (seed 0: the check moves no cursor)
            self.pick_task(request.task_id, 0, request.variant)
        await self.admission.enter(request.wait_s, hangup)
        try:  # the slot is taken (the record) before the next await
            self._refuse_create(request)  # again: the wait may have changed both
            task = self.pick_task(request.task_id, request.seed, request.variant)
            episode_id = request.episode_id or uuid.uuid4().hex
            rec = self.new_record(episode_id, task, request.seed)
            self.records[episode_id] = rec
        finally:
            self.admission.wake()  # a slot not taken after all goes to the next waiter
        return await self._start(rec, request)

    async def _start(self, rec: Record, request: wire.CreateEpisode) -> dict:
        """Create and reset the episode of a record that holds its slot."""
        task, episode_id = rec.task, rec.episode_id
        self.metrics.episode_started(task_kind(self.env, task))
        self.on_change()
        started = time.monotonic()
        try:
            rec.episode = await self.call(
                lambda: self.env.create_episode(task, seed=request.seed, episode_id=episode_id)
            )
            if rec.terminal is None:
                observation = await self.call(
                    rec.episode.reset, timeout=self.limits.reset_timeout_s
                )
        except Exception as exc:  # every failure must free the slot and be recorded
            if rec.terminal is not None:  # closed meanwhile; the close aborted the reset
                await self._closed_while_created(rec)
            if isinstance(exc, AtCapacity):
                # A gate below this service ran out first (the helper's
                # container starts, General's boots): nothing started, and a
                # trainer may retry it as any 429, not mask an infra failure.
                log.warning("reset refused at capacity: %s", exc, **rec.fields)
                await self._finish(
                    rec,
                    reward=None,
                    failure=FailureClass.INFRA,
                    observation={},
                    reason=f"reset refused at capacity: {exc}",
                )
                raise AtCapacity(
                    f"reset refused at capacity: {exc}",
                    retry_after=exc.retry_after,
                    episode_id=episode_id,
                    task_id=task.task_id,
                ) from None
            failure = self._failure_of(exc, rec, "reset")
            await self._finish(
                rec, reward=None, failure=failure, observation={}, reason=f"reset failed: {exc}"
            )
            raise InfraFailure(
                f"reset failed: {exc}",
                failure_class=failure,
                episode_id=episode_id,
                task_id=task.task_id,
            ) from None
        if rec.terminal is not None:
            await self._closed_while_created(rec)
        rec.timings["reset_s"] = time.monotonic() - started
        self.metrics.reset(rec.timings["reset_s"])
        rec.status = "running"
        rec.observation = observation
        rec.touch()
        log.info(
            "episode started (task %s, reset %.3f s)",
            task.task_id,
            rec.timings["reset_s"],
            **rec.fields,
        )
        reset: dict[str, Any] = {
            "event": "reset",
            "task_id": task.task_id,
            "seed": request.seed,
            "observation": observation,
        }
        if task.variant is not None:  # for the record of a killed service's recovery
            reset["canary"] = canaries.part(task.variant, None, None)
        self.outcomes.trajectory(episode_id, reset)
        return {
            "episode_id": episode_id,
            "task_id": task.task_id,
            "observation": observation,
            "reward": None,
            "done": False,
            "lease_expires_at": rec.lease_expires_at(),
        }

    def _refuse_create(self, request: wire.CreateEpisode) -> None:
        if self._stopping:
            raise Unavailable("service is shutting down")
        if request.episode_id and (
            request.episode_id in self.records or request.episode_id in self.finished
        ):
            raise EpisodeExists(f"episode {request.episode_id!r} exists")

    async def step(self, episode_id: str, request: wire.StepRequest) -> dict:
        rec = self._lookup(episode_id)
        if request.request_id and request.request_id in rec.responses:
            return rec.responses[request.request_id]
        if rec.status != "running":
            terminal = rec.terminal or {"episode_id": episode_id, "done": True}
            raise EpisodeDone(f"episode {episode_id!r} is {rec.status}", terminal=terminal)
        if rec.busy:
            raise EpisodeBusy(f"episode {episode_id!r} is running a step")
        self.validate_action(request.action)
        rec.busy = True
        # The step runs in the caller's task up to its answer: a task of its
        # own per step cost ~37 us of every step's HTTP round trip (issue 25,
        # bench/bench_http.py). Whatever must complete even if the caller is
        # cancelled meanwhile (a trainer's hang-up past the server's grace, a
        # closed MCP session, a shutdown) runs detached: the bookkeeping of
        # a step the caller stopped waiting for, and every step that ends
        # the episode (grade, outcome record). The busy flag is released by
        # whoever finishes the step.
        detached = False
        try:
            rec.touch()
            if time.monotonic() > rec.deadline:
                detached = True
                return await self._detached(
                    rec,
                    self._finish(
                        rec,
                        reward=None,
                        failure=FailureClass.TIMEOUT,
                        observation={},
                        reason="episode deadline passed",
                        request_id=request.request_id,
                    ),
                )
            rec.step_count += 1
            assert rec.episode is not None  # running: its reset or fork set it
            call = self.threads.call(
                rec.episode.step, request.action, timeout=self.limits.action_timeout_s
            )
            try:
                await call.wait()
            except asyncio.CancelledError:
                detached = True
                self._background(self._owning(rec, self._after_step(rec, request, call)))
                raise
            body = self._answer(rec, request, call)
            if body is not None:
                return body
            detached = True
            return await self._detached(rec, self._conclude(rec, request, call))
        finally:
            if not detached:
                rec.busy = False

    async def reference(self, episode_id: str) -> dict:
        """The reference solution's next action for a running episode."""
        rec = self._lookup(episode_id)
        self._operator_only("an episode's reference")
        if rec.status != "running":
            raise EpisodeDone(
                f"episode {episode_id!r} is {rec.status}",
                terminal=rec.terminal or {"episode_id": episode_id, "done": True},
            )
        if rec.busy:
            raise EpisodeBusy(f"episode {episode_id!r} is running a step")
        assert rec.episode is not None  # running: its reset or fork set it
        action = await self.call(rec.episode.reference_action, timeout=self.limits.action_timeout_s)
        return {"episode_id": episode_id, "action": None if action is None else dict(action)}

    async def _closed_while_created(self, rec: Record) -> None:
        """A DELETE (or shutdown) reached the episode before create answered.

        The close could not reach an episode that did not exist yet: close
        it now, and answer the create with the terminal state instead of a
        201 for an episode that is no longer in the table.
        """
        await self._close_episode(rec)
        raise EpisodeDone(
            f"episode {rec.episode_id!r} was closed while it was being created",
            terminal=rec.terminal,
        )

    async def _close_episode(self, rec: Record) -> None:
        if rec.episode is None or rec.episode_closed:
            return
        rec.episode_closed = True
        try:
            await self.call(rec.episode.close)
        except Exception:  # the outcome is already durable; log the leak
            log.exception("closing the episode failed", **rec.fields)

    def validate_action(self, action: Mapping[str, Any]) -> None:
        try:
            self._validate(action)
        except fastjsonschema.JsonSchemaException as exc:
            # the compiled validator raises only JsonSchemaValueException, which has .message
            message = cast(fastjsonschema.JsonSchemaValueException, exc).message
            raise InvalidAction(message.replace("data", "action", 1)) from None

    def _answer(self, rec: Record, request: wire.StepRequest, call: Call) -> dict | None:
        """A finished step call's answer when the episode goes on (the hot
        path: nothing here awaits), else None for ``_conclude``. An invalid
        action counts no step and is the caller's 422."""
        rec.timings["steps_s"] += call.seconds
        self.metrics.step(call.seconds)
        if isinstance(call.error, InvalidAction):
            rec.step_count -= 1
            raise call.error
        if call.error is not None and not isinstance(call.error, Exception):
            raise call.error
        if rec.terminal is not None:  # closed while the step ran
            return rec.terminal
        result: Step = call.value
        if call.error is not None or result.done or rec.step_count >= self.limits.max_steps:
            return None
        body = {
            "episode_id": rec.episode_id,
            "observation": dict(result.observation),
            "reward": result.reward,
            "done": False,
            "step": rec.step_count,
        }
        self.outcomes.trajectory(
            rec.episode_id,
            {
                "event": "step",
                "step": rec.step_count,
                "action": request.action,
                "observation": body["observation"],
                "reward": result.reward,
                "seconds": round(call.seconds, 6),
            },
        )
        rec.remember(request.request_id, body)
        rec.observation = body["observation"]
        rec.touch()
        return body

    async def _conclude(self, rec: Record, request: wire.StepRequest, call: Call) -> dict:
        """The end of the episode a step call ended (or failed): grade,
        outcome record, reply."""
        failure: FailureClass | None
        if call.error is not None:
            failure = self._failure_of(call.error, rec, "step")
            reward, failure = await self.null_proof.prove(rec, call.error, failure, "step")
            return await self._finish(
                rec,
                reward=reward,
                failure=failure,
                observation={},
                reason=str(call.error),
                request_id=request.request_id,
                action=request.action,
            )
        result: Step = call.value
        reward, failure, reason = result.reward, None, "done"
        if not result.graded:
            assert rec.episode is not None  # the step that just ended ran on it
            graded_at = time.monotonic()
            try:
                reward = float(
                    await self.call(rec.episode.grade, timeout=self.limits.grade_timeout_s)
                )
            except Exception as exc:
                failure, reason = self._failure_of(exc, rec, "grade"), str(exc)
                reward, failure = await self.null_proof.prove(rec, exc, failure, "grade")
            rec.timings["grade_s"] = time.monotonic() - graded_at
            self.metrics.grade(rec.timings["grade_s"])
        return await self._finish(
            rec,
            reward=reward,
            failure=failure,
            observation=result.observation,
            reason=reason,
            request_id=request.request_id,
            action=request.action,
        )

    async def _after_step(self, rec: Record, request: wire.StepRequest, call: Call) -> dict:
        """A step whose caller stopped waiting: its call's end, then what the
        caller would have done."""
        await call.wait()
        body = self._answer(rec, request, call)
        return body if body is not None else await self._conclude(rec, request, call)

    async def _owning(self, rec: Record, work: Awaitable[dict]) -> dict:
        try:
            return await work
        finally:
            rec.busy = False

    async def _detached(self, rec: Record, work: Awaitable[dict]) -> dict:
        """``work`` in a task of its own that completes (and then releases
        the episode) even if this caller is cancelled."""
        return await asyncio.shield(self._background(self._owning(rec, work)))

    def _background(self, work: Awaitable) -> asyncio.Task:
        # The loop keeps only weak references to tasks: a detached step must
        # not be collected mid-way.
        task = asyncio.ensure_future(work)
        self._detached_tasks.add(task)
        task.add_done_callback(self._detached_done)
        return task

    def _detached_done(self, task: asyncio.Task) -> None:
        self._detached_tasks.discard(task)
        if (
            not task.cancelled()
            and task.exception() is not None
            and not isinstance(task.exception(), CamgError)
        ):
            log.error("a detached step failed", exc_info=task.exception())

    def _failure_of(self, exc: BaseException, rec: Record, phase: str) -> FailureClass:
        if isinstance(exc, InfraFailure):
            log.warning("%s failed (%s): %s", phase, exc.failure_class.value, exc, **rec.fields)
            return exc.failure_class
        log.error("%s raised an unexpected error", phase, exc_info=exc, **rec.fields)
        return FailureClass.INFRA

    async def _finish(
        self,
        rec: Record,
        *,
        reward: float | None,
        failure: FailureClass | None,
        observation: Mapping[str, Any],
        reason: str,
        request_id: str | None = None,
        action: Any = None,
        status: str = "done",
        outcome: str | None = None,
    ) -> dict:
        """Terminal bookkeeping: outcome record (fsync'd), release, reply.

        Runs once per episode: a step that returns after its episode was
        closed (aborted, reaped, shut down) gets the existing terminal body.
        """
        if rec.terminal is not None:
            return rec.terminal
        rec.status = status
        rec.reward = reward if failure is None else None
        rec.failure_class = failure.value if failure else None
        body = {
            "episode_id": rec.episode_id,
            "observation": dict(observation),
            "reward": rec.reward,
            "done": True,
            "failure_class": rec.failure_class,
            "step": rec.step_count,
        }
        rec.terminal = body
        rec.remember(request_id, body)
        record: dict[str, Any] = {
            "environment": self.env.name,
            "episode_id": rec.episode_id,
            "task_id": rec.task.task_id,
            "seed": rec.seed,
            "reward": rec.reward,
            "failure_class": rec.failure_class,
            "status": status,
            "reason": reason[:2000],
            "steps": rec.step_count,
            "started_at": rec.started_wall,
            "ended_at": time.time(),
            "timings": {k: round(v, 6) for k, v in rec.timings.items()}
            | {"wall_s": round(time.monotonic() - rec.started, 6)},
            "config_hash": self.config_hash,
            "grader_hash": self.grader_hash(),
        }
        if rec.forked_from is not None:  # signed where present (camg.episodes.signing)
            record.update(forked_from=rec.forked_from, fork_step=rec.fork_step)
        if rec.obstructed is not None:
            # The control proved the failure the submission's: this verdict
            # stands over whatever the episode's own outcome says.
            record.update(
                integrity="obstructed",
                integrity_evidence=list(rec.obstructed),
                grade_reason="obstructed",
            )
        if rec.episode is not None:
            try:
                record.update({k: v for k, v in rec.episode.outcome().items() if k not in record})
            except Exception:  # extra fields must never cost the record itself
                log.exception("outcome fields of the episode failed", **rec.fields)
        # Also on the terminal reply, so a trainer needs no extra request for it.
        record["cost"] = rec.cost = body["cost"] = episode_cost(
            record.get("cost"), record["timings"]
        )
        variant = rec.task.variant
        if variant is not None:
            # The reward stands as the environment gave it (the policy must
            # not tell); the trainer's reply and the signed record say what it was.
            record["canary"] = rec.canary = body["canary"] = canaries.part(
                variant, rec.reward, record.get("integrity")
            )
            if rec.canary["outcome"] is not None:
                self.metrics.canary_ended(rec.canary["outcome"])
        # outcome: status, or "reaped" for a close by the lease reaper
        self.metrics.episode_ended(
            task_kind(self.env, rec.task),
            outcome or status,
            rec.failure_class,
            record.get("integrity"),
        )
        self.outcomes.trajectory(
            rec.episode_id,
            {
                "event": "end",
                "step": rec.step_count,
                "action": action,
                "observation": body["observation"],
                "reward": rec.reward,
                "failure_class": rec.failure_class,
                "reason": reason[:2000],
            },
        )
        await self.call(self._persist, rec, record)
        await self._close_episode(rec)
        self.records.pop(rec.episode_id, None)
        self.finished[rec.episode_id] = rec
        self.admission.wake()  # the slot goes to the oldest waiter
        while len(self.finished) > _TOMBSTONES:
            self.finished.popitem(last=False)
        log.info(
            "episode %s: reward %s failure %s after %d steps",
            status,
            rec.reward,
            rec.failure_class,
            rec.step_count,
            **rec.fields,
        )
        self.on_change()
        return body

    def _persist(self, rec: Record, record: dict) -> None:
        self.outcomes.finish_trajectory(rec.episode_id)
        self._store_submission(rec, record)
        self.outcomes.append(record)
        rec.outcome = {k: record.get(k) for k in REGRADE_FIELDS}
        if isinstance(record.get("seq"), int):
            # The trainer's receipt: the record's place in the signed log, so
            # a log cut after it is caught (python -m camg.verify --through).
            assert rec.terminal is not None  # _finish set it before it persists
            rec.terminal["outcome_seq"] = record["seq"]

    def _store_submission(self, rec: Record, record: dict) -> None:
        # Before the record: a record never names bytes that are not stored.
        # Only an episode that ended on its own submitted anything (one closed
        # by the trainer, its lease or a shutdown did not).
        if (
            rec.status != "done"
            or rec.episode is None
            or not callable(getattr(rec.episode, "submission", None))
        ):
            return
        try:
            submission = rec.episode.submission()
            if submission is not None:
                record["submission"] = self.submissions.put(submission)
        except Exception:  # a lost submission costs a regrade, never the record
            log.exception("storing the episode's submission failed", **rec.fields)

    def grader_hash(self) -> str | None:
        """The environment's grader hash (fixed for the life of the process
        once known: the grader is code and data loaded at start)."""
        if self._grader_hash is None:
            try:
                self._grader_hash = self.env.grader_hash()
            except Exception:
                log.exception("the environment's grader hash failed")
        return self._grader_hash

    async def create_group(self, request: wire.CreateEpisode, hangup=None) -> dict:
        """A GRPO group: one reset and its forks, all or none (camg.episodes.forking)."""
        return await self.forker.group(request, hangup)

    async def fork(self, episode_id: str, request: wire.ForkEpisode, hangup=None) -> dict:
        """A running, idle episode's child (camg.episodes.forking)."""
        return await self.forker.fork(episode_id, request, hangup)

    async def regrade(self, episode_id: str) -> dict:
        """Grade a finished episode's stored submission again (camg.episodes.regrading)."""
        # operators only, whoever owns it: the same 403 for any id, and the
        # regrader finds an episode a restart left in the outcome log alone
        self._operator_only("a regrade")
        return await self.regrader.regrade(episode_id)

    def state(self, episode_id: str, *, renew: bool = True) -> dict:
        """An episode's state; asking for one episode renews its lease."""
        rec = self._lookup(episode_id)
        if renew and rec.status == "running" and not rec.busy:
            rec.touch()
        state = {
            "episode_id": rec.episode_id,
            "task_id": rec.task.task_id,
            "status": "running" if rec.status == "starting" else rec.status,
            "step_count": rec.step_count,
            "reward": rec.reward,
            "failure_class": rec.failure_class,
            "seed": rec.seed,
            "started_at": rec.started_wall,
        }
        if rec.terminal is not None and "outcome_seq" in rec.terminal:
            state["outcome_seq"] = rec.terminal["outcome_seq"]
        if rec.cost is not None:
            state["cost"] = rec.cost
        if rec.canary is not None:  # only once it ended: a running one says nothing
            state["canary"] = rec.canary
        if rec.forked_from is not None:
            state.update(forked_from=rec.forked_from, fork_step=rec.fork_step)
        if rec.status == "running":
            state["lease_expires_at"] = rec.lease_expires_at()
            if rec.episode is not None:
                state["environment_state"] = dict(rec.episode.state())
        return state

    def list(self) -> list[dict]:
        # Listing renews nothing: a monitor polling GET /episodes must not
        # keep abandoned episodes (and their sandboxes) alive forever.
        return [
            self.state(eid, renew=False)
            for eid, rec in list(self.records.items())
            if auth.may_see(rec.owner)
        ]

    async def close(
        self,
        episode_id: str,
        reason: str = "closed by trainer",
        failure: FailureClass | None = None,
        outcome: str | None = None,
    ) -> dict:
        rec = self._lookup(episode_id)
        if rec.status in ("running", "starting"):
            if rec.episode is not None and rec.busy:
                # Abort the running step; its thread returns once the
                # environment has torn down what it was using.
                await self.call(rec.episode.close)
            await self._finish(
                rec,
                reward=None,
                failure=failure,
                observation={},
                reason=reason,
                status="closed",
                outcome=outcome,
            )
        elif rec.status == "done":
            rec.status = "closed"
        return self.state(episode_id)

    async def reap(self) -> None:
        """Close episodes whose lease or episode deadline has passed."""
        now = time.monotonic()
        for rec in list(self.records.values()):
            if rec.status != "running" or rec.busy:
                continue
            if now > rec.last_active + rec.idle_ttl:
                await self.close(
                    rec.episode_id, "lease expired", FailureClass.TIMEOUT, outcome="reaped"
                )
            elif now > rec.deadline:
                await self.close(
                    rec.episode_id,
                    "episode deadline passed",
                    FailureClass.TIMEOUT,
                    outcome="reaped",
                )

    async def shutdown(self) -> None:
        self._stopping = True
        self.admission.close()
        for episode_id in list(self.records):
            try:
                await self.close(episode_id, "service stopping", FailureClass.INFRA)
            except Exception:
                log.exception("closing episode %s at shutdown failed", episode_id)
        self.threads.shutdown()
        self.regrader.shutdown()
