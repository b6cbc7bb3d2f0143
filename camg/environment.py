"""The interface every environment (environments/<env>) implements.

The episode manager (camg.episodes.manager) owns ids, leases, deadlines, request
de-duplication, outcome records and the HTTP/OpenEnv surface. An
environment only knows how to start an episode for a task, apply an action,
grade a finished episode and release what it holds. All four calls are
synchronous and run on worker threads, so they may block on the helper, a
JVM or a test run; they must be safe to call from a thread other than the
one that created the episode.

Optional capability, regrading (camg.episodes.regrading): ``Episode.submission()``
hands the manager what the episode submitted (stored content-addressed
before its outcome record), and ``Environment.regrade(task, submission)``
grades it again later, without the episode. An environment without
``regrade`` answers ``regrade_unsupported``.

Optional capability, impossible variants (camg.config.variants): an environment
whose ``serves_variants`` is True gets tasks whose ``variant`` is set (in
``create_episode`` and ``regrade``) and must grade them with the variant's
grader material while showing the agent exactly what the origin task shows.
The manager refuses a manifest with variants for any other environment.

Errors an environment raises:
* ``camg.errors.InvalidAction`` — the action is malformed; nothing changed.
* ``camg.errors.InfraFailure`` and subclasses — the episode cannot go on
  honestly; the manager ends it with ``reward: null`` and the failure class.
Anything else is treated as ``InfraFailure`` (class ``infra``) and logged.
Before a step's or a grade's failure becomes a null, the manager asks
``Episode.control`` to prove it (camg.episodes.null_proof).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from camg.config.hashing import sha256_json
from camg.config.variants import Variant
from camg.errors import NotForkable, NotFound, RegradeUnsupported


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of the prepared manifest, in manifest order."""

    task_id: str
    data: Mapping[str, Any]
    #: set for an impossible variant's episode: ``task_id`` and ``data`` are
    #: its origin's (what the agent sees), the variant holds what grades it
    variant: Variant | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """What one action produced.

    ``done`` means the episode reached its end (finish action, step budget,
    a purchase...). The manager then calls ``Episode.grade`` unless
    ``reward`` is final already (``graded=True``).
    """

    observation: Mapping[str, Any]
    reward: float = 0.0
    done: bool = False
    graded: bool = False


@dataclasses.dataclass(frozen=True)
class Submission:
    """What a finished episode handed its grader, kept so it can be graded
    again (``POST /episodes/{id}/regrade``) after the episode is gone.

    ``data`` is the submitted bytes (a diff, a CSV, a verifier's detail),
    stored content-addressed under the service's state directory; ``meta``
    is small JSON (at most 64 KiB) kept in the outcome record itself (Shop's
    purchase, a screenshot's path and hash).
    """

    data: bytes = b""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Grade:
    """A regrade's answer: the reward and extra outcome-record fields."""

    reward: float
    outcome: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ServiceContext:
    """What the service hands every environment at start-up."""

    environment: str
    state_dir: str
    settings: Mapping[str, Any]
    helper_socket: str | None = None
    #: the manifest's files (label -> {path, sha256}) that camg.serve has
    #: just re-hashed: an environment need not hash them again at start
    verified_files: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    #: the manifest's impossible variants (camg.config.variants), for an environment
    #: that serves them to check and prepare at start
    variants: Sequence[Variant] = ()


class Episode(abc.ABC):
    """One running episode. Created by ``Environment.create_episode``."""

    @abc.abstractmethod
    def reset(self) -> Mapping[str, Any]:
        """Build whatever the episode needs; return the first observation."""

    @abc.abstractmethod
    def step(self, action: Mapping[str, Any]) -> Step:
        """Apply one validated action."""

    @abc.abstractmethod
    def grade(self) -> float:
        """Compute the reward of a finished episode (after the last step)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything; idempotent, and safe while a step is running
        (it is how the manager aborts a step that overran its deadline)."""

    def state(self) -> Mapping[str, Any]:
        """Extra, environment-specific state shown by GET /episodes/{id}."""
        return {}

    def reference_action(self) -> Mapping[str, Any] | None:
        """The next action of the environment's reference solution from this
        episode's current state (None: the reference has nothing more to do).

        It is the oracle of an operator's end-to-end check (``python -m
        camg_client --policy oracle``), served only where the deployment enables
        ``references``; it must not change the episode.
        """
        raise NotFound(f"{type(self).__name__} has no reference solution")

    def outcome(self) -> Mapping[str, Any]:
        """Extra fields for the episode's outcome record (e.g. Coding's
        ``integrity`` verdict); called once, after grading or failure."""
        return {}

    def submission(self) -> Submission | None:
        """What this episode submitted for grading (None: nothing, e.g. it
        was closed before it finished); called once, after grading or its
        failure. Environments that implement ``Environment.regrade`` return
        enough here to grade it again without the episode."""
        return None

    def control(self, failure: Exception, phase: str) -> Sequence[str] | None:
        """Prove a null: ``phase`` ("step" or "grade") of this episode failed
        with ``failure``; run the same path again on fresh resources with a
        control (the pristine tree with the gold fix, a control page, the
        reference submission), never where the agent's processes or files
        are.

        Return evidence lines when the control succeeds: the infrastructure
        works, so the submission caused the failure and the manager records
        reward 0.0 with integrity ``obstructed``. Raise (any exception) when
        the control fails too: the null stands. Return None where the
        environment has no control for this phase (the null stands,
        unproven). A trainer masks nulls, so an agent that can cause one
        hides every episode it expects to lose: an environment whose agent
        can reach its grading path must implement this."""
        return None

    def fork(self, episode_id: str) -> Episode:
        """A new, independent episode continuing from this one's present
        state (same task, seed, history and filesystem; POST
        /episodes/{id}/fork). Called only on a reset, idle, unfinished
        episode (the manager holds its step lock); the child is returned
        already reset, its ``reset()`` never called. Raise ``NotForkable``
        naming what cannot be carried (``what=...``, shown as ``details.what``)."""
        raise NotForkable(f"{type(self).__name__} episodes cannot be forked", what="environment")


class Environment(abc.ABC):
    """An environment service's domain object; one per service process."""

    #: name used in configs, routes, logs (CAMG_ENV) and unit names
    name: ClassVar[str]
    #: JSON Schemas served by GET /schema; actions are validated against it
    action_schema: ClassVar[Mapping[str, Any]]
    observation_schema: ClassVar[Mapping[str, Any]]
    #: grades tasks whose ``variant`` is set (camg.config.variants)
    serves_variants: ClassVar[bool] = False

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        self.context = context
        self.tasks = tasks

    @abc.abstractmethod
    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        """A new episode for ``task``; ``reset`` is called on it next."""

    def health(self) -> list[str]:
        """Reasons the service is degraded; empty when healthy."""
        return []

    def metadata(self) -> Mapping[str, Any]:
        """Hashes of whatever decides a reward, and other facts for /metadata."""
        return {}

    def task_facts(self, task: Task) -> Mapping[str, str | None]:
        """What ``GET /tasks`` lists of a task beside its id: its ``kind``
        and ``split`` (None where the dataset has none). The default reads
        the row's own ``kind`` and ``split`` (Shop's and General's rows carry
        them); an environment whose rows name them otherwise overrides this."""
        return {key: task.data.get(key) for key in ("kind", "split")}

    def grader_hash(self) -> str | None:
        """Hash of what decides a reward now, written into every outcome
        record: ``metadata()["grader"]`` alone when it is the only such
        entry, else the hash of its ``grader``, ``judge`` and ``rubric``."""
        meta = self.metadata()
        parts = {k: meta[k] for k in ("grader", "judge", "rubric") if meta.get(k) is not None}
        if set(parts) == {"grader"} and isinstance(parts["grader"], str):
            return parts["grader"]
        return sha256_json(parts) if parts else None

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """Grade a stored submission of ``task`` again with the current
        grader, without an episode (a worker thread, under the grading
        deadline). Raise ``InfraFailure`` as ``Episode.grade`` does."""
        raise RegradeUnsupported(f"the {self.name} environment cannot regrade episodes")

    def start_in_only_thread(self) -> None:  # noqa: B027  # optional hook: a no-op unless overridden
        """Called once in the serving process before ``start``, in its main
        thread while no other thread exists (the event loop has started none
        yet). For what must hold for every thread of the process:
        capabilities are per thread, so a capability is dropped for good only
        where it is dropped before any thread is created."""

    def start(self) -> None:  # noqa: B027  # optional hook: a no-op unless overridden
        """Called once in the serving process before READY=1 (load indexes,
        connect to the helper, verify prepared files), in a worker thread."""

    def stop(self) -> None:  # noqa: B027  # optional hook: a no-op unless overridden
        """Called once at shutdown after every episode is closed."""
