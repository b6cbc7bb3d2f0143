"""A null is a claim the service proves.

A trainer masks every episode whose reward is null. An agent that can make
its own episode's step or grade fail (fill its pids table before finish,
make the grader's scratch unwritable, crash a renderer) would hide every
episode it expects to lose, and a policy learns that quickly. So before a
failure becomes a null, the episode's ``control`` (camg.environment) runs
the same path on fresh resources with a control submission:

* the control succeeds: the infrastructure works and the submission caused
  the failure. Reward 0.0, integrity ``obstructed``, the failure and the
  control named in the record's evidence;
* the control fails too: the null stands with its failure class, and the
  service's health is degraded for a while (an operator sees the grading
  path broken, not just a masked episode);
* the environment has no control for that phase: the null stands unproven
  and degrades health the same way.

``camg_null_controls_total{result}`` counts each outcome (obstructed,
confirmed, unproven, control_error).
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING

from camg.errors import FailureClass

if TYPE_CHECKING:
    from camg.episodes.manager import EpisodeManager, Record

log = logging.getLogger("camg.episodes")

#: how long a null that was not disproved keeps the service degraded
DEGRADED_FOR_S = 300.0
#: evidence lines kept per episode, each at most this many characters
_EVIDENCE_LINES = 8
_EVIDENCE_CHARS = 500


class NullProof:
    """The manager's half: runs ``Episode.control`` and keeps the account."""

    def __init__(self, manager: EpisodeManager) -> None:
        self.manager = manager
        self.recent: collections.deque[tuple[float, str]] = collections.deque(maxlen=64)

    async def prove(
        self, rec: Record, exc: BaseException, failure: FailureClass, phase: str
    ) -> tuple[float | None, FailureClass | None]:
        """(reward, failure class) for an episode whose ``phase`` failed:
        (0.0, None) when its control succeeds, else (None, ``failure``)."""
        m = self.manager
        episode = rec.episode
        if episode is None or not isinstance(exc, Exception):
            return None, failure
        started = time.monotonic()
        try:
            evidence = await m.call(episode.control, exc, phase, timeout=m.limits.grade_timeout_s)
        except Exception as control_exc:
            log.warning(
                "%s failed (%s) and its control failed too: %s",
                phase,
                failure.value,
                control_exc,
                **rec.fields,
            )
            self._degrade(failure, "confirmed")
            return None, failure
        finally:
            rec.timings["control_s"] = time.monotonic() - started
        if evidence is None:
            self._degrade(failure, "unproven")
            return None, failure
        rec.obstructed = [f"{phase} failed ({failure.value}): {exc}"[:_EVIDENCE_CHARS]] + [
            str(line)[:_EVIDENCE_CHARS] for line in list(evidence)[: _EVIDENCE_LINES - 1]
        ]
        m.metrics.null_control("obstructed")
        log.warning(
            "%s failed (%s) but its control succeeded: the submission obstructed "
            "grading (reward 0.0): %s",
            phase,
            failure.value,
            rec.obstructed,
            **rec.fields,
        )
        return 0.0, None

    def _degrade(self, failure: FailureClass, result: str) -> None:
        self.manager.metrics.null_control(result)
        self.recent.append((time.monotonic(), failure.value))

    def health(self) -> list[str]:
        """Reasons the service is degraded: recent nulls no control disproved."""
        cutoff = time.monotonic() - DEGRADED_FOR_S
        classes = collections.Counter(c for t, c in self.recent if t >= cutoff)
        if not classes:
            return []
        named = ", ".join(f"{n} {c}" for c, n in sorted(classes.items()))
        return [
            f"episodes ended with reward null in the last {DEGRADED_FOR_S:g} s and no "
            f"control disproved it ({named})"
        ]
