"""Per-request overhead of a step over loopback HTTP, against a direct
in-process call of the same environment step, measured in the same run.

    .venv/bin/python bench/bench_http.py [--steps 3000] [--metrics on|off]

Prints p50/p99 of both and the overhead (HTTP minus direct). Goal: the
overhead's p50 <= 0.5 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from camg.environment import ServiceContext, Task  # noqa: E402
from camg_client import Client  # noqa: E402
from tools.harness.counter_env import CounterEnvironment  # noqa: E402
from tools.harness.services import ServiceProcess, configure_counter  # noqa: E402

ACTION = {"operation": "guess", "value": -1}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def direct(steps: int) -> list[float]:
    env = CounterEnvironment(ServiceContext("counter", "/nonexistent", {}), [Task("t", {"target": 5})])
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="bench")
    episode.reset()
    samples = []
    for _ in range(steps):
        started = time.perf_counter()
        episode.step(ACTION)
        samples.append(time.perf_counter() - started)
    return samples


def over_http(steps: int, tmp: Path, metrics: str = "on") -> list[float]:
    service = ServiceProcess(configure_counter(tmp, limits={"max_steps": steps + 10}),
                             env={"CAMG_METRICS": metrics}).wait_ready()
    try:
        client = Client(service.url)
        eid = client.create()["episode_id"]
        for _ in range(200):  # warm up connection, caches, thread pool
            client.step(eid, ACTION)
        client.close(eid)
        eid = client.create()["episode_id"]
        samples = []
        for _ in range(steps):
            started = time.perf_counter()
            client.step(eid, ACTION)
            samples.append(time.perf_counter() - started)
        client.close(eid)
        return samples
    finally:
        service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    # off: the service's Prometheus metrics switched off (camg/metrics.py), to measure their cost
    parser.add_argument("--metrics", choices=("on", "off"), default="on")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = direct(args.steps)
        http = over_http(args.steps, Path(tmp), args.metrics)
    ms = lambda s: round(s * 1000, 3)  # noqa: E731
    result = {
        "steps": args.steps, "metrics": args.metrics,
        "direct_ms": {"p50": ms(percentile(base, .5)), "p99": ms(percentile(base, .99))},
        "http_ms": {"p50": ms(percentile(http, .5)), "p99": ms(percentile(http, .99)),
                    "mean": ms(statistics.fmean(http))},
        "overhead_ms": {"p50": ms(percentile(http, .5) - percentile(base, .5)),
                        "p99": ms(percentile(http, .99) - percentile(base, .99))},
        "goal_p50_ms": 0.5,
    }
    result["goal_met"] = result["overhead_ms"]["p50"] <= 0.5
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
