#!/usr/bin/env python3
"""Shop at scale: service memory, start time and search latency from the 1k
catalog to WebShop's full size (1,181,436 products), in one run.

    .venv/bin/python -m environments.shop.checks.bench_scale [--products 1181436]
        [--sizes 1000,100000] [--queries 300] [--threads 2] [--heap-mb 1024]
        [--json out.json]

Sizes measured: ``--sizes`` plus ``--products`` (the 1k row is the baseline
every other is compared with: ``x_1k`` ratios). For each size a catalog is
synthesised deterministically from the 1k one (environments/shop/checks/synth_catalog.py:
real products first, then perturbed copies), and WebShop's Lucene index is
built from it once (``index_build_s``, ``index_mb``), cached under
``$CAMG_CACHE/shop-scale/index-<size>-s<seed>-<key>`` keyed by the
generator's parameters (size, seed, the synthesiser's and the document
function's code, the indexing command, pyserini's version), so changing the
service never rebuilds an index. ``python -m camg.prepare_shop --index-dir``
then writes the product store, goals and manifest (``prepare_s``,
``store_mb``; cached by the preparation code's hash besides).

Measured on a real ``camg.serve`` Shop service over each preparation:
``start_s`` (process start to ready: hashing the store and the index,
JVM, index open, goal regeneration, the index sample check), the worker's
memory after 100 search steps over loopback HTTP (``worker``: VmRSS, VmHWM,
RssAnon, RssFile -- the index is memory-mapped, so the pages a search
touched count as file-backed RSS) and the HTTP search step p50/p99; and in
this process, search through the service's own ``Searcher`` on the same
index (``search``: p50/p99 over ``--queries`` distinct goal instructions
after a warm-up, cold: no result cache, with the search pool over the
index's slices, and its ids checked against Anserini's SimpleSearcher on
every query; ``search_one_thread``: the same on the calling thread alone;
``search_cached``: each query asked before, the result cache's hit path;
``search_short_queries``: the goals' own short WebShop queries, cold; all
with the searching thread's CPU time and the whole process's (the search
pool's threads included), after one untimed pass over every query
(``warm_pass_s``: the index's pages, the JIT); the load average at the row's start
and end), and what the pool costs in Python memory (``pool_python_mb``:
tracemalloc of opening the store and drawing the prices, against the
1-dict-per-product pool the service held before, for sizes <= 100k).
Goals (issue 25): at the largest size RSS <= 3 GiB, search p50 <= 15 ms,
p99 <= 50 ms, start <= 60 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from camg.config import task_manifest as manifest
from devtools.harness import shop as testing
from devtools.harness.auth import deployment_auth
from environments.shop import catalog, search, store
from environments.shop import prepare as prepare_shop
from environments.shop.checks.bench import percentiles, timed
from environments.shop.checks.scale import build_index, index_key, prepare

FULL = 1_181_436
GIB = 2**30


def memory(pid: int | str) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[f"{key}_mb"] = round(int(value.split()[0]) / 1024, 1)
    return fields


def serve(prepared: Path, heap_mb: int, queries: list[str]) -> dict:
    from camg.configure import configure
    from camg_client import Client
    from devtools.harness.services import ServiceProcess, clean_git_tree, free_port

    settings = json.loads((prepared / "settings.json").read_text())
    with tempfile.TemporaryDirectory(prefix="bench-shop-scale-") as tmp:
        tmp = Path(tmp)
        (tmp / "requirements.lock").write_text("pyserini==0.24.0\n")
        deployment = {
            "auth": deployment_auth(),
            "runtime_lock": str(tmp / "requirements.lock"),
            "state_root": str(tmp / "state"),
            "helper_socket": str(tmp / "helper.sock"),
            "executables": {},
            "environments": {
                "shop": {
                    "manifest": str(prepared / "manifest.json"),
                    "port": free_port(),
                    "capacity": 4,
                    "settings": dict(settings, jvm_heap_mb=heap_mb, verify_index_full=False),
                }
            },
        }
        (tmp / "deployment.json").write_text(json.dumps(deployment))
        configure(
            tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src")
        )
        service = ServiceProcess(tmp / "prepared" / "shop.json")
        try:
            started = time.perf_counter()
            service.wait_ready(timeout=900)
            start_s = time.perf_counter() - started
            client = Client(service.url)
            children = Path(f"/proc/{service.proc.pid}/task/{service.proc.pid}/children")
            worker = children.read_text().split()[0]
            ready = memory(worker)
            samples = []
            for query in queries:
                eid = client.create()["episode_id"]
                elapsed, _ = timed(client.step, eid, {"action": f"search[{query}]"})
                samples.append(elapsed)
                client.close(eid)
            return {
                "start_s": round(start_s, 1),
                "http_search_step": percentiles(samples),
                "worker_at_ready": ready,
                "worker": memory(worker),
                "served_products": _find(client.metadata(), "products"),
            }
        finally:
            service.stop()


def _find(body, key: str):
    """The first value under ``key`` anywhere in a JSON body."""
    if isinstance(body, dict):
        if key in body and isinstance(body[key], int):
            return body[key]
        body = list(body.values())
    if isinstance(body, list):
        for item in body:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def search_latency(
    prepared: Path,
    queries: list[str],
    *,
    threads: int | None = None,
    cached: bool = False,
    agreement: bool = False,
) -> dict:
    """Wall time per search, and the calling thread's CPU time (the JVM's
    search runs on it, and on the search pool's threads when the index has
    several slices): on a shared machine the wall time waits for a core.

    Cold (``cached`` False): the Searcher keeps no results, so every
    measured search is Lucene's, the 30 warm-up queries included. Cached:
    every query was asked once before it is measured, so each measured
    search is the result cache's hit path (what a GRPO group's repeated
    goal queries get). ``agreement``: the ids against Anserini's own
    SimpleSearcher.search on every query (one thread, stored documents)."""
    settings = json.loads((prepared / "settings.json").read_text())
    products = store.ProductStore(settings["product_pool"])
    searcher = search.Searcher(
        settings["index_dir"],
        products,
        threads=threads,
        cache_entries=len(queries) + 30 if cached else 0,
    )
    try:
        for query in queries[:30]:  # JIT warm-up, not measured
            searcher.search(query)
        if cached:
            for query in queries:
                searcher.search(query)
            hits_before = searcher.cache.hits
        samples, cpu, process_cpu = [], [], []
        for query in queries:
            started, process_started = time.thread_time(), time.process_time()
            samples.append(timed(searcher.search, query)[0])
            cpu.append(time.thread_time() - started)
            process_cpu.append(time.process_time() - process_started)
        out = dict(
            percentiles(samples),
            cpu_p50_ms=percentiles(cpu)["p50_ms"],
            cpu_p99_ms=percentiles(cpu)["p99_ms"],
            # every thread of this process: the search pool's too (and the JVM's own)
            process_cpu_p50_ms=percentiles(process_cpu)["p50_ms"],
            queries=len(queries),
            distinct=len(set(queries)),
            segments=searcher.segments,
            threads=searcher.threads,
            from_cache=searcher.cache.hits - hits_before if cached else 0,
        )
        if agreement:
            differing = [q for q in queries if searcher.search(q) != searcher.simple_search(q)]
            out["equal_to_simple_searcher"] = f"{len(queries) - len(differing)}/{len(queries)}"
    finally:
        searcher.close()
        products.close()
    return out


def pool_python_mb(prepared: Path, index_dir: Path, dict_baseline: bool) -> dict:
    """Python heap held by the pool: the store (with its prices) against
    the dict per product (and its option-value and ASIN sets) of before."""
    settings = json.loads((prepared / "settings.json").read_text())
    gc.collect()
    tracemalloc.start()
    products = store.ProductStore(settings["product_pool"])
    prices = products.prices(random.Random(0))
    for asin in list(products)[:: max(1, len(products) // 5000)]:
        products[asin]  # fill the LRU as pages would
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    out = {"store": round(held / 2**20, 1)}
    del prices
    products.close()
    if dict_baseline:
        gc.collect()
        tracemalloc.start()
        pool = list(
            prepare_shop.iter_pool(
                index_dir / "catalog" / "documents.jsonl",
                prepare_shop.DEFAULT_INSTRUCTIONS,
                prepare_shop.DEFAULT_HUMAN,
            )
        )
        by_asin = {p["asin"]: p for p in pool}
        option_values = frozenset(v for p in pool for vs in p["options"].values() for v in vs)
        known = frozenset(by_asin)
        prices = catalog.product_prices(pool, random.Random(0))
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out["dicts_before"] = round(held / 2**20, 1)
        del pool, by_asin, option_values, known, prices
        gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=FULL, help="the largest size")
    parser.add_argument("--sizes", default="1000,100000", help="the smaller sizes")
    parser.add_argument("--seed", type=int, default=0, help="the synthesiser's seed")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2, help="indexing threads")
    parser.add_argument("--heap-mb", type=int, default=1024, help="the JVM heap cap (-Xmx)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s} | {args.products})
    out, _ = testing.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    sample = random.Random(0).sample(list(tasks), args.queries)
    # the instruction as the query (25-30 terms: the worst case), and the
    # goal's WebShop search query ("hair loss products": what a shopper types)
    queries = [t.data["goal"]["instruction_text"].lower() for t in sample]
    short = [t.data["goal"]["query"].lower() for t in sample]
    search.boot_jvm(testing.java_home(), args.heap_mb)
    rows = {}
    key = index_key(args.seed)  # once: the sources may change while a long run goes on
    for size in sizes:
        index_dir, facts = build_index(size, args.seed, args.threads, key)
        prepared, prep_facts = prepare(index_dir, args.heap_mb)
        row = {**facts, **prep_facts}
        row["pool_python_mb"] = pool_python_mb(prepared, index_dir, size <= 100_000)
        row["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
        # one untimed pass first: the rows below compare the ways of searching,
        # not which of them first touched the index's pages or made the JIT compile
        row["warm_pass_s"] = round(timed(search_latency, prepared, queries + short)[0], 1)
        row["search"] = search_latency(prepared, queries, agreement=True)
        row["search_one_thread"] = search_latency(prepared, queries, threads=1)
        row["search_cached"] = search_latency(prepared, queries, cached=True)
        row["search_short_queries"] = search_latency(prepared, short)
        row.update(serve(prepared, args.heap_mb, queries[:100]))
        row["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        rows[size] = row
        print(json.dumps({size: row}), flush=True)
    base = rows.get(1000)
    if base:
        for row in rows.values():
            row["x_1k"] = {
                "index_mb": round(row["index_mb"] / base["index_mb"], 2),
                "start_s": round(row["start_s"] / base["start_s"], 2),
                "worker_rss": round(row["worker"]["VmRSS_mb"] / base["worker"]["VmRSS_mb"], 2),
                "search_p50": round(row["search"]["p50_ms"] / base["search"]["p50_ms"], 2),
                "search_p99": round(row["search"]["p99_ms"] / base["search"]["p99_ms"], 2),
            }
    largest = rows[max(rows)]
    result = {
        "sizes": rows,
        "heap_mb": args.heap_mb,
        "goals_at_largest": {
            "rss_le_3gib": largest["worker"]["VmHWM_mb"] * 2**20 <= 3 * GIB,
            "search_p50_le_15ms": largest["search"]["p50_ms"] <= 15.0,
            "search_p99_le_50ms": largest["search"]["p99_ms"] <= 50.0,
            "start_le_60s": largest["start_s"] <= 60.0,
            # the goals are read on cold searches of distinct queries
            "cold_queries_distinct": largest["search"]["distinct"] == largest["search"]["queries"],
        },
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
