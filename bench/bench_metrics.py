"""What the services' Prometheus metrics cost a step (issue 27: within
0.05 ms of metrics off), metrics on against off in the same run.

    .venv/bin/python bench/bench_metrics.py [--steps 3000] [--rounds 4]

Two measures, each alternating on and off in ABBA order over ``--rounds``
(so a host that gets busier or quieter during the run slows both alike):
the step through the episode manager in-process (bench_http.in_service:
where the hooks run, no HTTP noise) and over loopback HTTP
(bench_http.over_http, a ``camg.serve`` with CAMG_METRICS=on|off). Prints
p50 of each and the on-minus-off difference; separate runs of
``bench_http.py --metrics on`` and ``--metrics off`` differ by more than
that from the host's load alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_http import in_service, over_http, percentile  # noqa: E402
from camg import metrics  # noqa: E402

GOAL_MS = 0.05


def in_service_with(switch: str, steps: int, tmp: Path) -> list[float]:
    # build_service reads the switch from the environment (camg.metrics.for_environment)
    before = os.environ.get(metrics.SWITCH)
    os.environ[metrics.SWITCH] = switch
    try:
        return in_service(steps, tmp)
    finally:
        if before is None:
            os.environ.pop(metrics.SWITCH, None)
        else:
            os.environ[metrics.SWITCH] = before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4, help="even: ABBA order")
    args = parser.parse_args()
    order = [("on", "off") if r % 2 == 0 else ("off", "on") for r in range(args.rounds)]
    inproc: dict[str, list[float]] = {"on": [], "off": []}
    http: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r, pair in enumerate(order):
            for switch in pair:
                inproc[switch] += in_service_with(switch, args.steps, Path(tmp) / f"in-{r}-{switch}")
                http[switch] += over_http(args.steps, Path(tmp) / f"http-{r}-{switch}", switch)
    ms = lambda s: round(s * 1000, 4)  # noqa: E731
    result = {"steps": args.steps, "rounds": args.rounds, "goal_ms": GOAL_MS}
    for name, samples in (("in_service", inproc), ("http", http)):
        on, off = percentile(samples["on"], .5), percentile(samples["off"], .5)
        result[name] = {"on_p50_ms": ms(on), "off_p50_ms": ms(off),
                        "overhead_p50_ms": ms(on - off), "ratio": round(on / off, 3)}
    result["goal_met"] = result["in_service"]["overhead_p50_ms"] <= GOAL_MS \
        and result["http"]["overhead_p50_ms"] <= GOAL_MS
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
