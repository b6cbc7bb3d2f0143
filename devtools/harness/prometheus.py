"""A real Prometheus server for the tests (Debian's ``prometheus`` package,
packaging/apt/metrics.txt), started by pid on a loopback port with a config
and a storage directory of its own, and asked through its HTTP query API.

    with PrometheusServer(tmp, {"shop": "127.0.0.1:65131"}) as prom:
        prom.wait_up()
        prom.wait_for('sum(camg_episodes_ended_total)', lambda v: v == 2)

Scrapes every second: the series a test moves are in Prometheus' store
within about a scrape interval of the scrape that saw them.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devtools.harness.services import free_port

SCRAPE_INTERVAL_S = 1


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError("no prometheus binary: packaging/bootstrap.sh installs it "
                           "(packaging/apt/metrics.txt)")
    return found


class PrometheusServer:
    def __init__(self, base: Path, targets: Mapping[str, str]) -> None:
        """``targets``: job name -> host:port whose /metrics it scrapes."""
        self.base = base
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        base.mkdir(parents=True, exist_ok=True)
        interval = f"{SCRAPE_INTERVAL_S}s"
        config = {"global": {"scrape_interval": interval, "scrape_timeout": interval,
                             "evaluation_interval": interval},
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [t]}]}
                                     for job, t in targets.items()]}
        # JSON is YAML: no YAML writer needed.
        self.config = base / "prometheus.yml"
        self.config.write_text(json.dumps(config, indent=1))

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        self.log = open(self.base / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [binary(), f"--config.file={self.config}",
             f"--storage.tsdb.path={self.base / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {timeout:.0f} s:\n{self.output()}")

    def output(self) -> str:
        try:
            return (self.base / "prometheus.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- its HTTP API ---------------------------------------------------------
    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """An instant vector: (labels, value) per series."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, expr: str) -> float | None:
        """The one value of an expression that yields at most one series."""
        result = self.query(expr)
        if len(result) > 1:
            raise AssertionError(f"{expr} has {len(result)} series: {result}")
        return result[0][1] if result else None

    def wait_for(self, expr: str, ok: Callable[[Any], bool], *, timeout: float = 30.0,
                 by: str | None = None) -> Any:
        """Poll until ``ok`` holds of the expression's value (``by``: a dict
        of that label's value -> value instead); the last value otherwise,
        in the AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            got: Any = ({labels.get(by, ""): v for labels, v in self.query(expr)}
                        if by else self.value(expr))
            if ok(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr}: {got!r} after {timeout:.0f} s")
            time.sleep(0.25)

    def wait_up(self, timeout: float = 30.0) -> None:
        """Every target scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        while True:
            active = self.api("targets")["activeTargets"]
            if active and all(t["health"] == "up" for t in active):
                return
            if time.monotonic() > deadline:
                raise AssertionError("targets not up: " + json.dumps(
                    [(t["labels"].get("job"), t["health"], t.get("lastError")) for t in active]))
            time.sleep(0.25)

    def assert_plausible_histogram(self, name: str, selector: str, count: float,
                                   upper_s: float) -> None:
        """``name``'s buckets under ``selector`` (e.g. ``environment="shop"``) are
        cumulative and end at ``count``; its median lies in (0, upper_s) and its
        mean in (0, upper_s] (or the first bucket holding an observation)."""
        buckets = sorted((float(labels["le"]), v) for labels, v in
                         self.query(f"{name}_bucket{{{selector}}}"))
        assert buckets and buckets[-1] == (float("inf"), count), (name, selector, buckets)
        values = [v for _, v in buckets]
        assert values == sorted(values), f"{name} buckets are not cumulative: {buckets}"
        median = self.value(f"histogram_quantile(0.5, {name}_bucket{{{selector}}})")
        assert median is not None and 0 < median < upper_s, (name, selector, median)
        mean = self.value(f"{name}_sum{{{selector}}} / {name}_count{{{selector}}}")
        first = next(le for le, v in buckets if v > 0)
        assert mean is not None and 0 < mean <= max(first, upper_s), (name, selector, mean)
