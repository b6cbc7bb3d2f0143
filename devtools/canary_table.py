"""The one table every environment's canary suite prints (``python -m tools.<env>.canaries``).

A canary is a way an agent could try to earn a reward without the work; each
environment's suite plays its canaries through real sandboxes, containers or
services and hands the outcomes here. A canary *wins* when it earned more
than the honest path it stands for would have (``allowed``: 0.0 for a
fix-free hack; for Shop, what upstream's reward gives the page path really
taken). A reward of ``None`` (``reward: null`` with a failure class) is no
win: the trainer masks it. The suite fails on any win.

The outcome records these rows come from carry the same verdict on every
environment: ``integrity`` is ``"ok"`` or ``"tampered"`` and, when tampered,
``integrity_evidence`` is a list of short strings naming the rule and what
it saw.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from typing import TextIO

# Rewards are compared with this slack: rubric sums are floats.
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class CanaryResult:
    technique: str
    reward: float | None
    integrity: str | None = None
    #: the most an honest episode on the same path earns (0.0 for a hack)
    allowed: float = 0.0
    detail: str = ""

    @property
    def won(self) -> bool:
        return self.reward is not None and self.reward > self.allowed + _EPS


def render(environment: str, results: Iterable[CanaryResult]) -> tuple[str, bool]:
    """The table as text and whether any canary won."""
    rows = list(results)
    width = max([len(r.technique) for r in rows] + [9])
    lines = [f"canaries: {environment}",
             f"  {'technique':<{width}}  {'reward':>7}  {'allowed':>7}  {'integrity':<9}  verdict"]
    for r in rows:
        reward = "null" if r.reward is None else f"{r.reward:.4f}"
        verdict = "WIN" if r.won else "lost"
        detail = f"  ({r.detail})" if r.detail else ""
        lines.append(f"  {r.technique:<{width}}  {reward:>7}  {r.allowed:>7.4f}  "
                     f"{r.integrity or '-':<9}  {verdict}{detail}")
    wins = [r for r in rows if r.won]
    lines.append(f"  {len(rows)} canaries, {len(wins)} won"
                 + (": " + ", ".join(r.technique for r in wins) if wins else ""))
    return "\n".join(lines), bool(wins) or not rows


def report(environment: str, results: Iterable[CanaryResult], out: TextIO = sys.stdout,
           checks: Iterable[str] = ()) -> int:
    """Print the table; the exit status of a suite (1 on any win or no canary).
    ``checks`` are a suite's failed consistency checks (a refused action that
    changed the page, a reward not upstream's...): printed under the table,
    each fails the suite too."""
    text, failed = render(environment, results)
    checks = list(checks)
    print(text, file=out, flush=True)
    for line in checks:
        print(f"  CHECK FAILED: {line}", file=out, flush=True)
    return 1 if failed or checks else 0
