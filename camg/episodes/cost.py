"""What one episode cost the host, as its outcome record and finished state
carry it (issue 27): ``cost = {cpu_s, memory_peak_bytes, disk_written_bytes,
phases: {reset_s, steps_s, grade_s, wall_s}, judge_tokens}``.

The environment measures what it can (its episode's ``outcome()["cost"]``:
a sandbox's cgroups through SandboxUsage, a container's through
ContainerUsage, a judge's reported tokens); the service adds the phases it
timed itself. A measure the environment could not take is absent, never a
made-up 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from camg.web.http_wire import COST_SCHEMA

#: the measured fields (the wire's schema names them, camg/web/http_wire.py)
MEASURES = tuple(k for k in COST_SCHEMA["properties"] if k != "phases")


def episode_cost(measured: Any, phases: Mapping[str, float]) -> dict:
    """The record's ``cost``: the environment's measures (unknown keys
    dropped, so an episode cannot smuggle fields into the signed record
    under this name) and the service's phase timings."""
    measured = measured if isinstance(measured, Mapping) else {}
    out: dict[str, Any] = {k: measured[k] for k in MEASURES if measured.get(k) is not None}
    out["phases"] = {k: round(float(v), 6) for k, v in phases.items()}
    return out


def add_tokens(total: dict[str, int], usage: Any) -> None:
    """Sum a judge reply's ``usage`` into ``total`` (OpenAI's field names;
    a reply without usage adds nothing rather than a guessed count)."""
    if not isinstance(usage, Mapping):
        return
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total[key] = total.get(key, 0) + value


def judge_tokens(reported: Any) -> dict:
    """``{"judge_tokens": {...}}`` summed over the judge verdicts' reported
    usages (camg.grading.judge.Verdict.record's judge_tokens), or {} when none
    reported any."""
    total: dict[str, int] = {}
    for usage in reported:
        add_tokens(total, usage)
    return {"judge_tokens": total} if total else {}
