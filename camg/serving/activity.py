"""What each service did over the last minutes, for ``camg status``: episodes
per minute and the failure classes they ended with, from the counters its
``GET /metrics`` exports (camg/metrics.py), as Prometheus would compute them.

A one-shot CLI has no history of its own, so it keeps one: each run's scrape
is added to a small state file (``--state``; samples older than
``WINDOW_S`` are dropped) and the rates are the increase since the oldest
sample still in the window. A run with no earlier sample there (the first,
or after a quiet quarter of an hour) scrapes twice, ``SAMPLE_S`` apart, and
says over how many seconds it measured. A counter lower than its earlier
sample is a restarted worker: its whole value is the increase (Prometheus'
``increase()`` rule), never a negative rate.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from camg import atomic

#: samples older than this (seconds) are dropped: "the last minutes"
WINDOW_S = 900.0
#: the span of a run's own two scrapes when the state file has no usable sample
SAMPLE_S = 5.0
#: an earlier sample nearer than this is no window at all (a second run at once)
MIN_SPAN_S = 1.0
STATE_VARIABLE = "CAMG_STATUS_STATE"
STARTED, ENDED = "camg_episodes_started_total", "camg_episodes_ended_total"


def default_state() -> Path:
    if os.environ.get(STATE_VARIABLE):
        return Path(os.environ[STATE_VARIABLE])
    return (
        Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        / "camg"
        / "status-samples.json"
    )


def counters(exposition: str) -> dict:
    """The episode counters of one scrape, summed over the labels status
    does not show: ``{"started": n, "ended": {"outcome/failure_class": n}}``."""
    started = 0.0
    ended: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == STARTED:
                started += s.value
            elif s.name == ENDED:
                key = f"{s.labels.get('outcome', 'none')}/{s.labels.get('failure_class', 'none')}"
                ended[key] = ended.get(key, 0.0) + s.value
    return {"started": started, "ended": ended}


def scrape(port: int, timeout: float = 3.0) -> dict | None:
    """One timed sample of the service on 127.0.0.1:port; None when it has
    no metrics (unreachable, switched off, an older service)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except (OSError, urllib.error.HTTPError, ValueError):
        return None
    try:
        return {"t": time.time(), **counters(text)}
    except ValueError:  # not the exposition format
        return None


def _increase(now: float, then: float) -> float:
    return now - then if now >= then else now


def activity(earlier: Mapping, now: Mapping) -> dict:
    """Rates between two samples of one service."""
    span = max(now["t"] - earlier["t"], 1e-9)
    ended: dict[str, float] = {}
    for key, value in now["ended"].items():
        grew = _increase(value, earlier["ended"].get(key, 0.0))
        if grew:
            ended[key] = grew
    outcomes: dict[str, float] = {}
    failures: dict[str, float] = {}
    for key, n in ended.items():
        outcome, failure = key.split("/", 1)
        outcomes[outcome] = outcomes.get(outcome, 0) + n
        if failure != "none":
            failures[failure] = failures.get(failure, 0) + n
    return {
        "window_s": round(span, 3),
        "ended_per_min": round(60 * sum(ended.values()) / span, 2),
        "started_per_min": round(60 * _increase(now["started"], earlier["started"]) / span, 2),
        "outcomes": {k: int(v) for k, v in sorted(outcomes.items())},
        "failure_classes": {k: int(v) for k, v in sorted(failures.items())},
    }


class Samples:
    """The state file: service key -> samples, oldest first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
            self.data: dict[str, list] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.data = {}

    def earliest(self, key: str, now: float) -> dict | None:
        for sample in self.data.get(key, []):
            if now - WINDOW_S <= sample.get("t", 0) <= now - MIN_SPAN_S:
                return sample
        return None

    def add(self, key: str, sample: Mapping) -> None:
        kept = [s for s in self.data.get(key, []) if s.get("t", 0) >= sample["t"] - WINDOW_S]
        self.data[key] = kept + [dict(sample)]

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_json(self.path, self.data, mode=0o600)
        except OSError:
            pass  # an unwritable state file costs the next run its window, nothing else


def collect(ports: Mapping[str, int], state: Path, sample_s: float = SAMPLE_S) -> dict[str, Any]:
    """environment -> its activity (or None without metrics)."""
    samples = Samples(state)
    now = {env: scrape(port) for env, port in ports.items()}
    earlier = {
        env: samples.earliest(f"{env}@{ports[env]}", s["t"])
        for env, s in now.items()
        if s is not None
    }
    if sample_s > 0 and any(e is None for e in earlier.values()):
        time.sleep(sample_s)
        for env in [e for e, s in earlier.items() if s is None]:
            second = scrape(ports[env])
            if second is not None:
                earlier[env], now[env] = now[env], second
    out: dict[str, Any] = {}
    for env, sample in now.items():
        if sample is None:
            out[env] = None
            continue
        samples.add(f"{env}@{ports[env]}", sample)
        before = earlier.get(env)
        out[env] = activity(before, sample) if before else None
    if any(s is not None for s in now.values()):
        samples.save()
    return out


def describe(act: Mapping | None) -> str:
    """One line for the table."""
    if act is None:
        return "-"
    window = act["window_s"]
    span = f"{window / 60:.0f} min" if window >= 90 else f"{window:.0f} s"
    failures = ", ".join(f"{k} {v}" for k, v in act["failure_classes"].items()) or "no failures"
    return f"{act['ended_per_min']:g}/min ended over {span} ({failures})"
