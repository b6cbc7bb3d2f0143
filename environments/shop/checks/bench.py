#!/usr/bin/env python3
"""Shop benchmark: search and step latency (p50/p99) on the 1k catalog, and
the resident memory of a process serving it.

    .venv/bin/python -m environments.shop.checks.bench \
        [--queries 500] [--episodes 100] [--json out.json]

Search is measured two ways in the same run, on the same queries:
* ``webshop_baseline`` — upstream WebShop's procedure: LuceneSearcher.search
  (k=50), then fetch and json-decode each hit's stored raw document to read
  its id (engine.get_top_n_product_from_keywords);
* ``shop_search`` — our Searcher.search (same LuceneSearcher call, ids from
  the hit docids, filtered to the pool), reported with its ratio to the
  baseline.
Steps are timed through ``ShopEpisode.step`` for a scripted mix of actions
(search, next page, open product, choose option, sub page, back, buy),
with an invalid action's step (pure bookkeeping) as the in-run baseline.
With ``--service`` it also starts a real ``camg.serve`` Shop service
(gunicorn worker, JVM heap 1024 MiB) and reports the worker's resident
memory and the latency of search steps over loopback HTTP.
Goal: search p50 <= 20 ms. Uses the cached test preparation
(devtools.harness.shop; $CAMG_CACHE).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.environment import ServiceContext
from devtools.harness import shop as testing
from environments.shop.environment import ShopEnvironment

CONTROLS = ("back to search", "next >", "< prev")


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50_ms": round(pick(0.50) * 1e3, 3),
        "p99_ms": round(pick(0.99) * 1e3, 3),
        "mean_ms": round(statistics.mean(ordered) * 1e3, 3),
    }


def rss_mb(pid: str = "self") -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def bench_search(env: ShopEnvironment, queries: list[str]) -> dict:
    lucene = env.searcher._searcher  # the Anserini SimpleSearcher the service holds (pyjnius)

    def webshop(query: str) -> list[str]:
        hits = lucene.search(query, 50)
        docs = [lucene.doc(hit.docid) for hit in hits]
        return [a for a in (json.loads(d.get("raw"))["id"] for d in docs) if a in env.products]

    for query in queries[:20]:  # JIT warm-up, not measured
        webshop(query)
        env.searcher.search(query)
    base, ours = [], []
    for query in queries:  # interleaved, so both see the same machine load
        t_base, expected = timed(webshop, query)
        t_ours, got = timed(env.searcher.search, query)
        assert got == expected, query
        base.append(t_base)
        ours.append(t_ours)
    result = {"webshop_baseline": percentiles(base), "shop_search": percentiles(ours)}
    result["ratio_p50"] = round(
        result["shop_search"]["p50_ms"] / result["webshop_baseline"]["p50_ms"], 3
    )
    return result


def bench_steps(env: ShopEnvironment, tasks, episodes: int, rng: random.Random) -> dict:
    by_kind: dict[str, list[float]] = {}
    invalid: list[float] = []

    def step(episode, kind, action):
        elapsed, result = timed(episode.step, {"action": action})
        by_kind.setdefault(kind, []).append(elapsed)
        return result.observation

    for task in rng.sample(list(tasks), episodes):
        episode = env.create_episode(task, seed=None, episode_id=f"bench-{task.task_id}")
        episode.reset()
        obs = step(episode, "search", f"search[{task.data['goal']['instruction_text']}]")
        if "next >" in obs["available_actions"]["clickables"]:
            obs = step(episode, "next_page", "click[next >]")
        products = [c for c in obs["available_actions"]["clickables"] if c not in CONTROLS]
        obs = step(episode, "open_product", f"click[{rng.choice(products)}]")
        values = [c for c in obs["available_actions"]["clickables"][6:]]
        if values:
            obs = step(episode, "choose_option", f"click[{rng.choice(values)}]")
        step(episode, "sub_page", "click[features]")
        step(episode, "back", "click[< prev]")
        elapsed, _ = timed(episode.step, {"action": "click[not there]"})
        invalid.append(elapsed)
        step(episode, "buy", "click[buy now]")
        episode.close()
    result = {kind: percentiles(samples) for kind, samples in by_kind.items()}
    everything = [s for samples in by_kind.values() for s in samples]
    result["all_steps"] = percentiles(everything)
    result["invalid_action_baseline"] = percentiles(invalid)
    return result


def bench_service(queries: list[str], episodes: int) -> dict:
    import tempfile

    from camg_client import Client
    from devtools.harness.services import ServiceProcess

    with tempfile.TemporaryDirectory(prefix="bench-shop-") as tmp:
        service = ServiceProcess(testing.configure_service(Path(tmp), jvm_heap_mb=1024))
        try:
            started = time.perf_counter()
            service.wait_ready(timeout=300)
            ready_s = time.perf_counter() - started
            client = Client(service.url)
            samples = []
            for query in queries[:episodes]:
                eid = client.create()["episode_id"]
                elapsed, _ = timed(client.step, eid, {"action": f"search[{query}]"})
                samples.append(elapsed)
                client.close(eid)
            workers = Path(f"/proc/{service.proc.pid}/task/{service.proc.pid}/children")
            worker = workers.read_text().split()[0]
            return {
                "ready_s": round(ready_s, 1),
                "http_search_step": percentiles(samples),
                "worker_memory_mb": rss_mb(worker),
                "arbiter_memory_mb": rss_mb(str(service.proc.pid)),
            }
        finally:
            service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--service", action="store_true", help="also measure a real camg.serve process over HTTP"
    )
    args = parser.parse_args(argv)
    rng = random.Random(0)
    out, settings = testing.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    before = rss_mb()
    env = ShopEnvironment(ServiceContext("shop", "/tmp", dict(settings, jvm_heap_mb=1024)), tasks)
    start_s, _ = timed(env.start)
    after_start = rss_mb()
    sample = rng.sample(list(tasks), args.queries)
    queries = [t.data["goal"]["instruction_text"].lower() for t in sample]
    results = {
        "catalog_products": len(env.products),
        "start_s": round(start_s, 2),
        "search": bench_search(env, queries),
        "steps": bench_steps(env, tasks, args.episodes, rng),
        "memory_mb": {"before_start": before, "after_start": after_start, "after_run": rss_mb()},
        "jvm_heap_max_mb": round(env.metadata()["jvm_heap_max_bytes"] / 2**20),
    }
    env.stop()
    if args.service:
        results["service"] = bench_service(queries, args.episodes)
    p50 = results["search"]["shop_search"]["p50_ms"]
    results["goal_search_p50_le_20ms"] = p50 <= 20.0
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if p50 <= 20.0 else 1


if __name__ == "__main__":
    sys.exit(main())
