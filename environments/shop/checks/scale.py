"""Synthesised Shop catalogs at scale, indexed and prepared once and cached,
for environments/shop/checks/bench_scale.py and the unit tier's generated-catalog test.

An index is a function of the generator's parameters only (size, seed, the
synthesiser's and the document function's code, the indexing command,
pyserini's version): it is cached under
``$CAMG_CACHE/shop-scale/index-<size>-s<seed>-<key>`` and a change to the
service never rebuilds it (1.18 M products take many minutes on 2 cores).
The preparation over it (store, goals, manifest: ``camg.prepare_shop
--index-dir``) is cached beside it, keyed by the preparation code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from devtools.harness import shop as testing
from environments.shop import catalog, goals, store
from environments.shop import prepare as prepare_shop
from environments.shop.checks import synth_catalog

REPO = Path(__file__).resolve().parents[3]


def timed(fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def cache_root() -> Path:
    root = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test")) / "shop-scale"
    root.mkdir(parents=True, exist_ok=True)
    return root


def tree_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def _hash(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
    return digest.hexdigest()[:10]


def index_key(seed: int) -> str:
    """What the index is a function of: the generator and the documents."""
    return _hash(
        Path(synth_catalog.__file__).read_bytes(),
        inspect.getsource(catalog.document),
        inspect.getsource(_build_index),
        inspect.getsource(_split),
        inspect.getsource(prepare_shop.build_index),
        metadata.version("pyserini"),
        str(seed),
    )


def prepare_key() -> str:
    return _hash(
        Path(prepare_shop.__file__).read_bytes(),
        Path(store.__file__).read_bytes(),
        Path(goals.__file__).read_bytes(),
        Path(catalog.__file__).read_bytes(),
    )


def build_index(
    size: int, seed: int = 0, threads: int = 2, key: str | None = None
) -> tuple[Path, dict]:
    """Synthesise a catalog and index it (cached by ``key``, default
    ``index_key(seed)``); (directory, build facts)."""
    out = cache_root() / f"index-{size}-s{seed}-{key or index_key(seed)}"
    with testing.locked(cache_root() / f".{out.name}.lock"):
        return _build_index(out, size, seed, threads)


def _build_index(out: Path, size: int, seed: int, threads: int) -> tuple[Path, dict]:
    facts_path = out / "build-facts.json"
    if facts_path.exists():
        return out, json.loads(facts_path.read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # Plain JSON lines (gzip -9 was half the synthesis time at 1.18 M), and
    # the catalog's lines are the index's JsonCollection: the collection
    # prepare_shop would write differs only in the stored raw "product" of
    # the 1,000 real products (its instruction fields), never in an id or
    # the contents searched (catalog.document reads neither), which is all
    # search and verify_index read.
    catalog_path = out / "catalog" / "documents.jsonl"
    synth_s, count = timed(
        synth_catalog.write_catalog,
        synth_catalog.synthesize(synth_catalog.real_products(), size, seed),
        catalog_path,
    )
    # Anserini's IndexCollection gives each file of the collection to one of
    # its threads, and each thread writes its own segment: the catalog in
    # ``threads`` contiguous parts is indexed on all of them, into as many
    # segments, which Searcher then searches in parallel (its slices). BM25
    # reads the whole index's statistics, so the scores are those of one
    # segment; the parts are deleted after.
    collection = out / "collection"
    split_s, _ = timed(_split, catalog_path, collection, count, threads)
    build_s, _ = timed(
        prepare_shop.build_index, collection, out / "index", testing.java_home(), threads
    )
    shutil.rmtree(collection)
    facts = {
        "products": count,
        "synthesise_s": round(synth_s + split_s, 1),
        "index_build_s": round(build_s, 1),
        "index_mb": tree_mb(out / "index"),
        "catalog_mb": round(catalog_path.stat().st_size / 2**20, 1),
        "threads": threads,
        "segments": len(list((out / "index").glob("*.si"))),
    }
    facts_path.write_text(json.dumps(facts))
    return out, facts


def _split(catalog_path: Path, collection: Path, count: int, parts: int) -> None:
    """The catalog's lines in ``parts`` contiguous files of the collection."""
    collection.mkdir(parents=True)
    parts = max(1, min(parts, count))
    outs = [open(collection / f"part-{i}.jsonl", "wb") for i in range(parts)]
    try:
        with open(catalog_path, "rb") as lines:
            for i, line in enumerate(lines):
                outs[i * parts // count].write(line)
    finally:
        for handle in outs:
            handle.close()


def prepare(index_dir: Path, heap_mb: int) -> tuple[Path, dict]:
    """camg.prepare_shop on the cached index: store, goals, manifest (cached)."""
    out = index_dir / f"prepared-{prepare_key()}"
    with testing.locked(index_dir / f".{out.name}.lock"):
        return _prepare(out, index_dir, heap_mb)


def _prepare(out: Path, index_dir: Path, heap_mb: int) -> tuple[Path, dict]:
    facts_path = out / "prepare-facts.json"
    if facts_path.exists():
        return out, json.loads(facts_path.read_text())
    for stale in index_dir.glob("prepared-*"):
        shutil.rmtree(stale)  # an older preparation code's store: gigabytes at full size
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "camg.prepare_shop",
            "--output",
            str(out),
            "--catalog",
            str(index_dir / "catalog" / "documents.jsonl"),
            "--java-home",
            testing.java_home(),
            "--index-dir",
            str(index_dir / "index"),
            "--sample-index-check",
            "--jvm-heap-mb",
            str(heap_mb),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"prepare_shop failed for {index_dir}:\n{proc.stderr[-3000:]}")
    facts = {
        "prepare_s": round(time.perf_counter() - started, 1),
        "store_mb": round((out / store.FILE_NAME).stat().st_size / 2**20, 1),
    }
    facts_path.write_text(json.dumps(facts))
    return out, facts
