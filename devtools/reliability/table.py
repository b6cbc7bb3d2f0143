"""The one table every run prints: suite, environment, what was done, what
was counted, result."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Row:
    suite: str
    environment: str
    done: str
    counted: str
    ok: bool | None  # None: not run (``counted`` says why)

    @property
    def result(self) -> str:
        return "not run" if self.ok is None else ("PASS" if self.ok else "FAIL")


def render(rows: list[Row]) -> str:
    head = ("suite", "environment", "what was done", "what was counted", "result")
    cells = [head] + [(r.suite, r.environment, r.done, r.counted, r.result) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    line = lambda c: "| " + " | ".join(v.ljust(w) for v, w in zip(c, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep] + [line(c) for c in cells[1:]])
