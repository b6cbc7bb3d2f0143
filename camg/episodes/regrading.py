"""``POST /episodes/{id}/regrade``: grade a finished episode again.

The episode is gone by then (its sandbox, container or page state): what
is left is its outcome record and the submission the record names
(camg.episodes.submissions). The environment grades that submission with its
current grader (``Environment.regrade``) and a second outcome record is
appended: ``status: "regraded"``, the new ``reward``/``failure_class``,
the current ``grader_hash``, ``regrade_of`` (the original reward, failure
class, grader hash and end time) and ``same_grader``. Both records stay.

One regrade at a time per episode (409 ``episode_busy``), none while the
episode runs (409 ``episode_running``), at most ``REGRADES`` at once per
service on threads of their own, under the grading deadline. A regrade
that fails for infrastructure reasons is recorded like a grade: ``reward:
null`` and the failure class, never a fake 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from camg.config.service_config import Limits
from camg.environment import Environment, Task
from camg.episodes import canaries
from camg.episodes.outcomes import OutcomeLog
from camg.episodes.submissions import SubmissionStore
from camg.episodes.worker_threads import WorkerThreads
from camg.errors import (
    EpisodeBusy,
    EpisodeNotFound,
    EpisodeRunning,
    FailureClass,
    InfraFailure,
    NoSubmission,
    RegradeUnsupported,
    TaskNotFound,
)
from camg.logs import episode_fields

log = logging.getLogger("camg.episodes")

#: regrades graded at once per service (each may hold a sandbox or a judge call)
REGRADES = 4
#: what a regrade needs of the episode's own outcome record (kept in memory
#: for the manager's finished episodes; older ones are found in the log)
REGRADE_FIELDS = (
    "task_id",
    "seed",
    "reward",
    "failure_class",
    "status",
    "grader_hash",
    "ended_at",
    "submission",
    "canary",
)


class Episodes(Protocol):
    """What a regrade reads of the episode manager (camg.episodes.manager), all public."""

    env: Environment
    limits: Limits
    config_hash: str
    outcomes: OutcomeLog
    submissions: SubmissionStore

    # read-only here: the manager's own mapping types may be narrower
    @property
    def tasks(self) -> Mapping[str, Task]: ...

    @property
    def records(self) -> Mapping[str, Any]: ...

    @property
    def finished(self) -> Mapping[str, Any]: ...

    @property
    def variant_tasks(self) -> Mapping[str, Task]: ...

    def grader_hash(self) -> str | None: ...

    async def call(
        self,
        fn: Callable,
        *args: Any,
        timeout: float | None = None,
        threads: WorkerThreads | None = None,
    ) -> Any: ...


class Regrader:
    def __init__(self, manager: Episodes) -> None:
        self.manager = manager
        # Threads of their own: a regrade never takes a running episode's
        # step or abort thread. Twice the slots: a regrade past its deadline
        # keeps its thread until the environment returns.
        self.threads = WorkerThreads(2 * REGRADES, f"camg-{manager.env.name}-regrade")
        self._slots: asyncio.Semaphore | None = None
        self._running: set[str] = set()

    def supported(self) -> bool:
        return type(self.manager.env).regrade is not Environment.regrade

    async def regrade(self, episode_id: str) -> dict:
        m = self.manager
        if not self.supported():
            raise RegradeUnsupported(f"the {m.env.name} environment cannot regrade episodes")
        rec = m.records.get(episode_id)
        if rec is not None:
            raise EpisodeRunning(
                f"episode {episode_id!r} is {rec.status}: regrade it once it has ended"
            )
        if episode_id in self._running:
            raise EpisodeBusy(f"a regrade of episode {episode_id!r} is running")
        self._running.add(episode_id)
        # Shielded like a step: a trainer that hangs up still gets its record.
        return await asyncio.shield(asyncio.ensure_future(self._regrade(episode_id)))

    async def _original(self, episode_id: str) -> dict:
        m = self.manager
        done = m.finished.get(episode_id)
        original = done.outcome if done is not None else None
        if original is None:
            original = await m.call(m.outcomes.find, episode_id, threads=self.threads)
        if original is None:
            raise EpisodeNotFound(f"no episode {episode_id!r} in this service's outcome log")
        return original

    async def _regrade(self, episode_id: str) -> dict:
        m = self.manager
        try:
            original = await self._original(episode_id)
            ref = original.get("submission")
            if not ref:
                raise NoSubmission(
                    f"episode {episode_id!r} has no stored submission (it ended "
                    f"{original.get('status')} before it submitted)"
                )
            task = self._task(original)
            submission = await m.call(m.submissions.get, ref, threads=self.threads)
            if self._slots is None:
                self._slots = asyncio.Semaphore(REGRADES)
            async with self._slots:
                started_wall, started = time.time(), time.monotonic()
                reward, failure, reason, extra = await self._grade(task, submission, episode_id)
                seconds = time.monotonic() - started
            now = m.grader_hash()
            record = {
                "environment": m.env.name,
                "episode_id": episode_id,
                "task_id": task.task_id,
                "seed": original.get("seed"),
                "reward": reward,
                "failure_class": failure.value if failure else None,
                "status": "regraded",
                "reason": reason[:2000],
                "started_at": started_wall,
                "ended_at": time.time(),
                "timings": {"grade_s": round(seconds, 6)},
                "config_hash": m.config_hash,
                "grader_hash": now,
                "regrade_of": {
                    k: original.get(k)
                    for k in ("reward", "failure_class", "grader_hash", "ended_at")
                },
                "same_grader": now is not None and now == original.get("grader_hash"),
                "submission": ref,
            }
            if task.variant is not None:
                # a variant's regrade is a canary's too, judged by its new grade
                record["canary"] = canaries.part(task.variant, reward, extra.get("integrity"))
            record.update({k: v for k, v in extra.items() if k not in record})
            await m.call(m.outcomes.append, record, threads=self.threads)
            log.info(
                "regraded: reward %s failure %s (was %s)",
                reward,
                record["failure_class"],
                original.get("reward"),
                extra=episode_fields(episode_id, task.task_id),
            )
            return record
        finally:
            self._running.discard(episode_id)

    def _task(self, original: Mapping[str, Any]) -> Task:
        """The task the episode was: its variant's (camg.config.variants) when its
        record says it was a canary, else its own."""
        m = self.manager
        canary = original.get("canary")
        if isinstance(canary, Mapping):
            variant = m.variant_tasks.get(cast(str, canary.get("variant")))
            if variant is None:
                raise TaskNotFound(
                    f"variant {canary.get('variant')!r} is not in this service's selection any more"
                )
            return variant
        # an id that is missing (None) finds no task either: TaskNotFound
        task = m.tasks.get(cast(str, original.get("task_id")))
        if task is None:
            raise TaskNotFound(
                f"task {original.get('task_id')!r} is not in this service's selection any more"
            )
        return task

    async def _grade(self, task, submission, episode_id: str):
        """(reward, failure class, reason, extra record fields)."""
        m = self.manager
        fields: dict[str, Any] = {"extra": episode_fields(episode_id, task.task_id)}
        try:
            grade = await m.call(
                m.env.regrade,
                task,
                submission,
                timeout=m.limits.grade_timeout_s,
                threads=self.threads,
            )
            return float(grade.reward), None, "regraded", dict(grade.outcome)
        except (RegradeUnsupported, NoSubmission):
            raise  # answered as errors: nothing was graded
        except InfraFailure as exc:
            log.warning("regrade failed (%s): %s", exc.failure_class.value, exc, **fields)
            return None, exc.failure_class, str(exc), {}
        except Exception as exc:  # no honest grade: reward null, never a fake 0
            log.error("regrade raised an unexpected error", exc_info=exc, **fields)
            return None, FailureClass.INFRA, f"{type(exc).__name__}: {exc}", {}

    def shutdown(self) -> None:
        self.threads.shutdown()
