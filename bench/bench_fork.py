#!/usr/bin/env python3
"""Fork latency (POST /episodes/{id}/fork, issue 26) per environment, against
creating a fresh episode of the same task in the same run.

    .venv/bin/python bench/bench_fork.py [--env shop --env counter] [--n 200]
        [--written 0 --written 1000000 --written 100000000] [--json out.json]

Two levels per environment, each a ratio against its own baseline:

* ``episode`` (where the environment runs in this process): ``Episode.fork``
  against ``create_episode`` + ``reset``, the environment's own cost;
* ``http``: a real ``camg.serve`` process over loopback, ``POST
  /episodes/{id}/fork`` against ``POST /episodes``, everything a trainer
  waits for (the manager, the outcome log's trajectory, HTTP).

Samples alternate fork and fresh, so a busy host slows both alike; each
child and each fresh episode is closed after its sample (not timed). The
parent first plays the subject's ``prefix`` actions, then, for each
``--written`` size a subject can write (``write``: sandbox environments),
the actions that make the agent write that many bytes: fork cost against
written bytes. Goals (issue 26): Shop p50 <= 1 ms; sandbox environments
p50 <= 10 ms whatever was written; containers <= 500 ms.

An environment is one ``Subject`` in ``SUBJECTS``: how to configure its
service (and optionally build it in process), which task, which actions
before the fork. Adding one is a few lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from camg.environment import Environment, ServiceContext, Task  # noqa: E402
from camg_client import Client  # noqa: E402
from tools.harness.services import ServiceProcess, configure_counter  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Subject:
    #: a prepared service config for this environment under the given directory
    configure: Callable[[Path], Path]
    #: the task every episode of the run plays (None: the service's first)
    task_id: Callable[[], str | None] = lambda: None
    #: actions the parent plays before it is forked (a realistic state)
    prefix: Callable[[], list[dict]] = lambda: []
    #: actions that make the agent write ``n`` bytes (None: nothing to write)
    write: Callable[[int], list[dict]] | None = None
    #: (environment started in this process, its task), for the episode level
    in_process: Callable[[Path], tuple[Environment, Task]] | None = None
    #: seconds the service may take to start
    ready_s: float = 60.0


def _counter_in_process(tmp: Path) -> tuple[Environment, Task]:
    from tools.harness.counter_env import CounterEnvironment
    task = Task("t", {"target": 5})
    return CounterEnvironment(ServiceContext("counter", str(tmp), {}), [task]), task


def _shop_task() -> str:
    from tools.harness import shop
    return json.loads((shop.prepared()[0] / "manifest.json").read_text())["tasks"][7]["task_id"]


def _shop_prefix() -> list[dict]:
    # search the goal's product by its title and open the first result: a
    # results page, a page stack and a listed set to copy
    from daemons.shop.store import ProductStore
    from tools.harness import shop
    out, settings = shop.prepared()
    task = json.loads((out / "manifest.json").read_text())["tasks"][7]
    products = ProductStore(settings["product_pool"])
    title = products[task["data"]["goal"]["asin"]]["Title"].replace("[", " ").replace("]", " ")
    products.close()
    return [{"action": f"search[{title}]"}, {"action": "click[next >]"}]


def _shop_in_process(tmp: Path) -> tuple[Environment, Task]:
    from camg import task_manifest as manifest
    from daemons.shop.environment import ShopEnvironment
    from tools.harness import shop
    out, settings = shop.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    env = ShopEnvironment(ServiceContext("shop", str(tmp),
                                         dict(settings, jvm_heap_mb=shop.TEST_HEAP_MB)), tasks)
    return env, tasks[7]


def _shop_configure(tmp: Path) -> Path:
    from tools.harness import shop
    return shop.configure_service(tmp, capacity=8)


SUBJECTS: dict[str, Subject] = {
    "counter": Subject(configure=lambda tmp: configure_counter(tmp, capacity=8),
                       prefix=lambda: [{"operation": "guess", "value": 1}],
                       in_process=_counter_in_process),
    "shop": Subject(configure=_shop_configure, task_id=_shop_task, prefix=_shop_prefix,
                    in_process=_shop_in_process, ready_s=300.0),
}


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50) * 1e3, 4),
            "p99_ms": round(pick(0.99) * 1e3, 4),
            "mean_ms": round(statistics.fmean(ordered) * 1e3, 4)}


def compare(fork: list[float], fresh: list[float]) -> dict:
    a, b = percentiles(fork), percentiles(fresh)
    return {"fork": a, "fresh": b, "ratio_p50": round(a["p50_ms"] / b["p50_ms"], 3)}


def timed(fn: Callable, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def bench_episode(subject: Subject, tmp: Path, n: int) -> dict:
    env, task = subject.in_process(tmp)
    env.start()
    try:
        parent = env.create_episode(task, seed=None, episode_id="bench-parent")
        parent.reset()
        for action in subject.prefix():
            parent.step(action)
        forks, fresh = [], []
        for i in range(n):
            elapsed, child = timed(parent.fork, f"bench-child-{i}")
            forks.append(elapsed)
            child.close()

            def create(i=i):
                episode = env.create_episode(task, seed=None, episode_id=f"bench-fresh-{i}")
                episode.reset()
                return episode
            elapsed, episode = timed(create)
            fresh.append(elapsed)
            episode.close()
        parent.close()
        return compare(forks, fresh)
    finally:
        env.stop()


def bench_http(subject: Subject, tmp: Path, n: int, written: list[int]) -> dict:
    service = ServiceProcess(subject.configure(tmp)).wait_ready(timeout=subject.ready_s)
    try:
        client = Client(service.url)
        task_id = subject.task_id()
        sizes = written if subject.write is not None else [0]
        results = {}
        for size in sizes:
            parent = client.create(task_id=task_id)["episode_id"]
            for action in subject.prefix() + (subject.write(size) if size else []):
                client.step(parent, action)
            forks, fresh = [], []
            for _ in range(n):
                elapsed, child = timed(client.fork, parent)
                forks.append(elapsed)
                client.close(child["episode_id"])
                elapsed, episode = timed(client.create, task_id)
                fresh.append(elapsed)
                client.close(episode["episode_id"])
                client.get(parent)  # keeps the parent's lease (not timed)
            client.close(parent)
            results[f"written_{size}"] = compare(forks, fresh)
        return results
    finally:
        service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", choices=sorted(SUBJECTS),
                        help="environments to measure (default: all)")
    parser.add_argument("--n", type=int, default=200, help="samples of each, per level")
    parser.add_argument("--written", type=int, action="append",
                        help="bytes the agent writes before the fork (environments that write; "
                             "default 0, 1 MB, 100 MB)")
    parser.add_argument("--no-http", action="store_true", help="the episode level only")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    written = args.written or [0, 1_000_000, 100_000_000]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        for name in args.env or sorted(SUBJECTS):
            subject, here = SUBJECTS[name], Path(tmp) / name
            here.mkdir()
            results[name] = {}
            if subject.in_process is not None:
                (here / "in-process").mkdir()
                results[name]["episode"] = bench_episode(subject, here / "in-process", args.n)
            if not args.no_http:
                results[name]["http"] = bench_http(subject, here / "http", args.n, written)
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
