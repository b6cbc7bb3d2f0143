#!/usr/bin/env python3
"""Shop at scale: how index build, index size, service start, memory and
search latency grow from the 1k catalog to 10k and 100k products.

    .venv/bin/python bench/bench_shop_scale.py [--sizes 1000,10000,100000]
        [--queries 300] [--threads 2] [--heap-mb 2048] [--json out.json]

For each size: the catalog is synthesised deterministically from the 1k
catalog (tools/shop/synth_catalog.py: real products first, then perturbed
copies), camg.prepare_shop's own steps build the pool, the JsonCollection
and WebShop's Lucene index (timed: ``index_build_s``; ``index_mb`` is its
size on disk), then ``python -m camg.prepare_shop --index-dir`` verifies it
and writes the manifest. A real ``camg.serve`` Shop service is started on it
(``start_s``: process start to ready, i.e. pool load, hash checks, JVM,
index open and its sample check) and its worker's resident memory read;
search is timed in this process on the same index (``Searcher.search``,
the service's call) and over loopback HTTP as search steps. The 1k row is
the baseline each larger size is compared with (``x_1k`` ratios).
Goals (issue 14): search p50 <= 10 ms at 100k; start <= 30 s.
Prepared catalogs are cached under $CAMG_CACHE/shop/scale-<size>-<code>.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_shop import percentiles, rss_mb, timed  # noqa: E402
from camg import task_manifest as manifest  # noqa: E402
from daemons.shop import prepare as prepare_shop  # noqa: E402
from daemons.shop import search  # noqa: E402
from tools.harness import shop as testing  # noqa: E402
from tools.shop import synth_catalog  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def tree_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def code_key() -> str:
    sources = [Path(synth_catalog.__file__), Path(prepare_shop.__file__),
               Path(prepare_shop.catalog.__file__)]
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:10]


def prepare_size(size: int, threads: int, heap_mb: int, key: str) -> tuple[Path, dict]:
    """Synthesise, index (timed) and prepare one catalog size (cached)."""
    out = testing.cache_root() / f"scale-{size}-{key}"
    facts_path = out / "build-facts.json"
    if facts_path.exists() and (out / "settings.json").exists():
        return out, json.loads(facts_path.read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    catalog_path = out / "documents.jsonl.gz"
    synth_s, _ = timed(synth_catalog.write_catalog,
                       synth_catalog.synthesize(synth_catalog.real_products(), size), catalog_path)
    products = prepare_shop.build_pool(catalog_path, prepare_shop.DEFAULT_INSTRUCTIONS,
                                       prepare_shop.DEFAULT_HUMAN)
    prepare_shop.write_collection(products, out / "collection")
    index = out / "index"
    build_s, _ = timed(prepare_shop.build_index, out / "collection", index,
                       testing.java_home(), threads)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "camg.prepare_shop", "--output", str(out / "prepared"),
         "--catalog", str(catalog_path), "--java-home", testing.java_home(),
         "--index-dir", str(index), "--sample-index-check", "--jvm-heap-mb", str(heap_mb)],
        cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"prepare_shop failed for {size}:\n{proc.stderr[-3000:]}")
    shutil.copy(out / "prepared" / "settings.json", out / "settings.json")
    facts = {"products": len(products), "synthesise_s": round(synth_s, 1),
             "index_build_s": round(build_s, 1), "index_mb": tree_mb(index),
             "pool_mb": round((out / "prepared" / "product_pool.json").stat().st_size / 2**20, 1),
             "prepare_rest_s": round(time.perf_counter() - started, 1), "threads": threads}
    facts_path.write_text(json.dumps(facts))
    return out, facts


def serve(size_dir: Path, heap_mb: int, queries: list[str]) -> dict:
    from camg_client import Client
    from camg.configure import configure
    from tools.harness.services import ServiceProcess, clean_git_tree, free_port
    settings = json.loads((size_dir / "settings.json").read_text())
    with tempfile.TemporaryDirectory(prefix="bench-shop-scale-") as tmp:
        tmp = Path(tmp)
        (tmp / "requirements.lock").write_text("pyserini==0.22.1\n")
        deployment = {
            "runtime_lock": str(tmp / "requirements.lock"), "state_root": str(tmp / "state"),
            "helper_socket": str(tmp / "helper.sock"), "executables": {},
            "environments": {"shop": {
                "manifest": str(size_dir / "prepared" / "manifest.json"), "port": free_port(),
                "capacity": 4,
                "settings": dict(settings, jvm_heap_mb=heap_mb, verify_index_full=False)}}}
        (tmp / "deployment.json").write_text(json.dumps(deployment))
        configure(tmp / "deployment.json", tmp / "prepared",
                  source_tree=clean_git_tree(tmp / "src"))
        service = ServiceProcess(tmp / "prepared" / "shop.json")
        try:
            started = time.perf_counter()
            service.wait_ready(timeout=900)
            start_s = time.perf_counter() - started
            client = Client(service.url)
            samples = []
            for query in queries:
                eid = client.create()["episode_id"]
                elapsed, _ = timed(client.step, eid, {"action": f"search[{query}]"})
                samples.append(elapsed)
                client.close(eid)
            children = Path(f"/proc/{service.proc.pid}/task/{service.proc.pid}/children")
            worker = children.read_text().split()[0]
            return {"start_s": round(start_s, 1), "http_search_step": percentiles(samples),
                    "worker_rss_mb": rss_mb(worker)["VmRSS"]}
        finally:
            service.stop()


def search_latency(size_dir: Path, queries: list[str]) -> dict:
    settings = json.loads((size_dir / "settings.json").read_text())
    pool = json.loads(Path(settings["product_pool"]).read_text())
    searcher = search.Searcher(settings["index_dir"], frozenset(p["asin"] for p in pool))
    try:
        for query in queries[:30]:  # JIT warm-up, not measured
            searcher.search(query)
        samples = [timed(searcher.search, query)[0] for query in queries]
    finally:
        searcher.close()
    return percentiles(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heap-mb", type=int, default=2048)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    out, _ = testing.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    queries = [t.data["goal"]["instruction_text"].lower()
               for t in random.Random(0).sample(list(tasks), args.queries)]
    search.boot_jvm(testing.java_home(), args.heap_mb)
    rows = {}
    key = code_key()   # once: the sources may change while a long run goes on
    for size in sizes:
        size_dir, facts = prepare_size(size, args.threads, args.heap_mb, key)
        row = dict(facts)
        row["search"] = search_latency(size_dir, queries)
        row.update(serve(size_dir, args.heap_mb, queries[:100]))
        rows[size] = row
        print(json.dumps({size: row}), flush=True)
    base = rows.get(1000)
    if base:
        for size, row in rows.items():
            row["x_1k"] = {
                "index_build_s": round(row["index_build_s"] / base["index_build_s"], 2),
                "index_mb": round(row["index_mb"] / base["index_mb"], 2),
                "start_s": round(row["start_s"] / base["start_s"], 2),
                "worker_rss_mb": round(row["worker_rss_mb"] / base["worker_rss_mb"], 2),
                "search_p50": round(row["search"]["p50_ms"] / base["search"]["p50_ms"], 2)}
    largest = rows[max(rows)]
    result = {"sizes": rows,
              "goal_search_p50_le_10ms_at_largest": largest["search"]["p50_ms"] <= 10.0,
              "goal_start_le_30s_at_largest": largest["start_s"] <= 30.0}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
