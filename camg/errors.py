"""The one error taxonomy of camg.

Every error a service, the helper client or a CLI raises on purpose is one of
these. Each subclasses the builtin it resembles, so generic code still
catches it sensibly, and carries a stable ``name`` that crosses process
boundaries (HTTP bodies, helper replies) instead of a class path.

HTTP statuses are mapped here once; resources never choose a status code.
"""

from __future__ import annotations

import enum


class FailureClass(str, enum.Enum):  # noqa: UP042  # StrEnum would change str() and format() of members
    """Why an episode ended without an honestly computed reward.

    Trainers mask these episodes instead of learning from a fake zero.
    """

    TIMEOUT = "timeout"
    SANDBOX_DIED = "sandbox_died"
    GRADER_ERROR = "grader_error"
    JUDGE_ERROR = "judge_error"
    #: the page could not be rendered honestly (browser did not start, render
    #: timed out, an external asset outside the mirror could not load)
    RENDER_ERROR = "render_error"
    INFRA = "infra"


class CamgError(Exception):
    """Base of every deliberate camg error."""

    name = "error"
    http_status = 500

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict:
        body: dict = {"error": self.name, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class ConfigError(CamgError, ValueError):
    """Configuration or deployment is invalid, or a prepared file mismatches."""

    name = "config_error"


class PreparationMissing(CamgError, FileNotFoundError):
    """Something a preparation step produces is missing; says which step."""

    name = "preparation_missing"

    def __init__(self, message: str, *, step: str, **details: object) -> None:
        super().__init__(f"{message} (finish this step first: {step})", step=step, **details)
        self.step = step


class DatasetError(CamgError, ValueError):
    """A task row, product record or image layer failed validation."""

    name = "dataset_error"


class BadRequest(CamgError, ValueError):
    """A request body or parameter is malformed."""

    name = "bad_request"
    http_status = 400


class InvalidAction(BadRequest):
    """An action does not fit the environment's action schema."""

    name = "invalid_action"
    http_status = 422


class PayloadTooLarge(BadRequest):
    name = "payload_too_large"
    http_status = 413


class Unauthorized(CamgError, PermissionError):
    """The request carries no token, or one no trainer holds."""

    name = "unauthorized"
    http_status = 401


class PermissionDenied(CamgError, PermissionError):
    """The caller may not do this (a foreign peer, a sandbox it does not own)."""

    name = "permission_denied"
    http_status = 403


class NotFound(CamgError, LookupError):
    name = "not_found"
    http_status = 404


class EpisodeNotFound(NotFound):
    name = "episode_not_found"


class TaskNotFound(NotFound):
    name = "task_not_found"


class Conflict(CamgError, RuntimeError):
    name = "conflict"
    http_status = 409


class EpisodeExists(Conflict):
    name = "episode_exists"


class EpisodeBusy(Conflict):
    """A step is already running on this episode."""

    name = "episode_busy"


class EpisodeDone(Conflict):
    """A step on a finished episode; ``details["terminal"]`` is the sticky answer."""

    name = "episode_done"


class EpisodeRunning(Conflict):
    """The episode has not finished yet (e.g. a regrade of a running episode)."""

    name = "episode_running"


class NoSubmission(Conflict):
    """A finished episode has no stored submission to regrade: it ended
    before it submitted, or its stored bytes were evicted or lost."""

    name = "no_submission"


class NotForkable(Conflict):
    """The episode cannot be forked in its present state, or this
    environment cannot carry some of it (``details["what"]`` names it, e.g.
    AutoResearch background jobs still running, or the fork depth bound)."""

    name = "not_forkable"


class RegradeUnsupported(CamgError, NotImplementedError):
    """This environment cannot grade a stored submission again."""

    name = "regrade_unsupported"
    http_status = 501


class AtCapacity(CamgError, RuntimeError):
    name = "at_capacity"
    http_status = 429

    def __init__(self, message: str, *, retry_after: int = 1, **details: object) -> None:
        super().__init__(message, retry_after=retry_after, **details)
        self.retry_after = retry_after


class Unavailable(CamgError, RuntimeError):
    """The service cannot take new work now (shutting down, degraded)."""

    name = "unavailable"
    http_status = 503


class InfraFailure(CamgError, RuntimeError):
    """An infrastructure failure inside an episode: reward becomes null.

    Environments raise this (or a subclass) from reset/step/grade; the
    episode manager turns it into a terminal observation with
    ``failure_class`` instead of an HTTP error.
    """

    name = "infra"
    # Only a failed reset reaches HTTP as an error (a failed step ends its
    # episode instead): no episode, no reward, the trainer may retry.
    http_status = 503
    failure_class = FailureClass.INFRA

    def __init__(
        self, message: str, *, failure_class: FailureClass | None = None, **details: object
    ) -> None:
        super().__init__(message, **details)
        if failure_class is not None:
            self.failure_class = FailureClass(failure_class)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "failure_class": self.failure_class.value}


class SandboxDied(InfraFailure):
    name = "sandbox_died"
    failure_class = FailureClass.SANDBOX_DIED


class GraderError(InfraFailure):
    name = "grader_error"
    failure_class = FailureClass.GRADER_ERROR


class JudgeError(InfraFailure):
    name = "judge_error"
    failure_class = FailureClass.JUDGE_ERROR


class RenderError(InfraFailure):
    name = "render_error"
    failure_class = FailureClass.RENDER_ERROR


class DeadlineExceeded(InfraFailure, TimeoutError):
    name = "timeout"
    failure_class = FailureClass.TIMEOUT
