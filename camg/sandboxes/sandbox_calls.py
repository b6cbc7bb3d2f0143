"""Helper calls of an episode that holds sandboxes, with the helper's errors
as episode failures (Coding, AutoResearch).

A sandbox that is gone (NotFound: destroyed by close() or a sweep) or whose
init died is SandboxDied; any other helper error not already an episode
failure is InfraFailure. Either way the episode's reward is null with the
failure class, never a fake 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from camg import errors

log = logging.getLogger("camg")

#: how often, and how far apart, the helper is asked whether a sandbox died
_DEATH_CHECKS, _DEATH_CHECK_S = 10, 0.1


def call(helper, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a call of ``helper`` whose first string
    argument (if any) names the sandbox it acts on."""
    try:
        return fn(*args, **kwargs)
    except (errors.SandboxDied, errors.NotForkable):
        raise
    except errors.NotFound as exc:
        raise errors.SandboxDied(f"sandbox is gone: {exc}") from None
    except errors.InfraFailure as exc:
        # A call racing the death of the sandbox's init can come back as a
        # generic failure; the helper's own view of the sandbox decides.
        sandbox = next((a for a in args if isinstance(a, str)), None)
        if sandbox is not None and died(helper, sandbox):
            raise errors.SandboxDied(f"sandbox {sandbox} died: {exc}") from None
        raise
    except errors.CamgError as exc:
        raise errors.InfraFailure(f"helper: {exc}") from None


def died(helper, sandbox: str) -> bool:
    """Whether the helper lists ``sandbox`` as dead (it may take a moment to
    reap a killed init: asked a few times); False when it cannot say."""
    for _ in range(_DEATH_CHECKS):
        try:
            listing = helper.list_sandboxes()
        except errors.CamgError:
            return False
        if any(
            entry.get("sandbox_id") == sandbox and entry.get("alive") is False for entry in listing
        ):
            return True
        time.sleep(_DEATH_CHECK_S)
    return False


class HeldSandbox:
    """The helper plumbing of an episode that holds a sandbox (Coding,
    AutoResearch); the episode sets ``helper``, ``sandbox`` (None once it is
    gone), ``_closed`` and the ``_lock`` that guards both."""

    helper: Any
    sandbox: str | None
    _closed: bool
    _lock: threading.Lock
    #: the agent sandbox's cost, read at finish (SandboxUsage)
    usage: dict | None = None

    def _sandbox(self) -> str:
        with self._lock:
            if self._closed or self.sandbox is None:
                raise errors.SandboxDied("the episode's sandbox is gone (episode closed)")
            return self.sandbox

    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return call(self.helper, fn, *args, **kwargs)

    def _take_usage(self, sandbox: str) -> None:
        """Read the agent sandbox's cost once, just before finish destroys it.

        An episode closed or reaped before it finished records no cpu or
        memory: the record is written on the event loop (episode.outcome()),
        where a helper round trip would stall every other episode, and its
        sandbox is destroyed right after."""
        try:
            self.usage = self.helper.sandbox_usage(sandbox)
        except errors.CamgError as exc:  # a lost measurement never costs the grade
            log.warning("reading sandbox %s usage failed: %s", sandbox, exc)

    def _cost(self) -> dict:
        """The outcome() field camg.episodes.cost completes with the phases."""
        return {"cost": dict(self.usage)} if self.usage else {}

    def _fork_sandbox(self, sandbox: str, processes: str = "processes") -> str:
        """A sandbox over ``sandbox``'s filesystem as it stands (the helper's
        ForkSandbox). Its two named refusals are NotForkable: a process still
        running in the parent (called ``processes`` here; a fork carries
        files, not processes) and ``fork_depth``; other helper errors are
        episode failures as for every call (the manager records them as the
        child's failed reset, never the parent's)."""

        def fork(sandbox_id: str) -> str:
            try:
                return self.helper.fork_sandbox(sandbox_id)["sandbox_id"]
            except (errors.BadRequest, errors.PermissionDenied) as exc:
                refusals: dict[object, str] = {
                    "not_allowed": processes,
                    "limit_exceeded": "fork_depth",
                }
                what = refusals.get(exc.details.get("helper_error"))
                if what is None:
                    raise
                raise errors.NotForkable(exc.message, what=what) from None

        return self._call(fork, sandbox)
