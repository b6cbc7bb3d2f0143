"""Prepare the Shop environment: product pool, search documents, Lucene
index, goals and the prepared manifest for ``camg.configure``.

    python -m camg.prepare_shop --output /srv/camg/data/shop \\
        --java-home /var/lib/camg/java [--goal-seed 0] [--splits test,eval,train]

writes into OUTPUT:

* ``product_pool.sqlite`` — the selected products in WebShop's processed
  form, in catalog order, as a product store (environments/shop/store.py), with
  the synthetic instruction fields (``instruction_text``,
  ``instruction_attributes``) and human instructions (``instructions``)
  merged in as WebShop's loader does; written in one streaming pass, so a
  1.18 M-product catalog is never in memory at once;
* ``collection/documents.jsonl`` — pyserini JsonCollection documents in
  WebShop's format (title, description, first bullet point, options,
  lowercased; the product record rides along as WebShop's does), the
  index's input: only written when the index is built here;
* ``index/`` — the Lucene index, built with ``python -m pyserini.index.lucene
  --collection JsonCollection --generator DefaultLuceneDocumentGenerator
  --threads 1 --storePositions --storeDocvectors --storeRaw``, then checked
  document by document against the pool;
* ``manifest.json`` — tasks (WebShop goals in goal-index order, then any
  exact-product rows), sampling settings, and the pool and index hashes;
* ``settings.json`` — the ``settings`` object for the deployment JSON.

The default catalog is the WebShop 1k catalog shipped in environments/shop/data.
For the full catalog (e.g. a MemoryArena checkout's WebShop data) pass
``--catalog .../search_engine/resources/documents.jsonl --instructions
.../data/items_ins_v2.json --human-instructions .../data/items_human_ins.json
--goals human`` and, to reuse its prebuilt index, ``--index-dir
.../search_engine/indexes`` (it is verified, not rebuilt).

MemoryArena: ``--memoryarena-db DIR`` takes the pool from a MemoryArena
product DB (``items_shuffle.json`` processed as its loader does, its
``items_ins_v2.json``, ``product_catalog/`` categories) and its
``search_engine/indexes-full`` (verified in place); ``--memoryarena-rows``
adds one task per subtask of its rows (JSONL or Parquet; see
environments/shop/memoryarena.py). Use ``--goals none`` to serve only those.

``--verify`` re-checks an OUTPUT prepared earlier (hashes, every index
document, regenerated goals) and changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from camg.config import progress
from camg.config import task_manifest as manifest
from camg.config.host_private import private_dir
from camg.errors import CamgError, ConfigError, DatasetError
from environments.shop import catalog, goals, javahome, memoryarena, search, store

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_CATALOG = DATA / "documents_1k.jsonl.gz"
DEFAULT_INSTRUCTIONS = DATA / "items_ins_v2_1000.json"
DEFAULT_HUMAN = DATA / "items_human_ins_1k_subset.json"
CREATED_BY = "camg.prepare_shop 0.1.0"


def _read_json(path: str | os.PathLike | None) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if not isinstance(body, dict):
        raise DatasetError(f"{path}: expected an object keyed by ASIN")
    return body


def build_pool(
    catalog_path: str | os.PathLike,
    instructions: str | os.PathLike | None,
    human_instructions: str | os.PathLike | None,
) -> list[dict]:
    """The product pool: catalog products with WebShop's instruction fields."""
    products = list(iter_pool(catalog_path, instructions, human_instructions))
    if not products:
        raise DatasetError(f"{catalog_path}: no products")
    return products


def iter_pool(
    catalog_path: str | os.PathLike,
    instructions: str | os.PathLike | None,
    human_instructions: str | os.PathLike | None,
) -> Iterator[dict]:
    """``build_pool``'s products one at a time, in catalog order."""
    synthetic = _read_json(instructions)
    human = _read_json(human_instructions)
    for product in catalog.iter_products(
        catalog.read_catalog_documents(catalog_path), str(catalog_path)
    ):
        asin = product["asin"]
        entry = synthetic.get(asin) or {}
        if entry.get("instruction") is not None:
            product["instruction_text"] = entry["instruction"]
            product["instruction_attributes"] = entry.get("instruction_attributes")
        if human.get(asin):
            product["instructions"] = human[asin]
        yield product


def memoryarena_pool(db: Path) -> tuple[list[dict], dict[str, str]]:
    """The pool of a MemoryArena product DB: items_shuffle.json processed as
    its loader does, each product carrying its product_catalog category
    (``catalog_category``, read by the MemoryArena score)."""
    memoryarena.check_db_layout(db)
    raw = _read_json_list(db / "items_shuffle.json")
    products = memoryarena.process_products(raw, _read_json(db / "items_ins_v2.json"))
    categories = memoryarena.catalog_categories(db)
    for product in products:
        product["catalog_category"] = categories.get(product["asin"].upper(), "")
    return [catalog.validate_product(p, f"{db}/items_shuffle.json") for p in products], categories


def _read_json_list(path: Path) -> list:
    try:
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if not isinstance(body, list):
        raise DatasetError(f"{path}: expected a JSON list of products")
    return body


def pool_bytes(products: list[dict]) -> bytes:
    return (json.dumps(products, ensure_ascii=False) + "\n").encode()


def write_collection(products: Iterable[dict], directory: Path) -> int:
    """The index's input documents (``directory/documents.jsonl``), streamed."""
    count = 0
    with _collection_writer(directory) as write:
        for product in products:
            write(catalog.document(product))
            count += 1
    return count


@contextlib.contextmanager
def _collection_writer(directory: Path) -> Iterator:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".documents.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        yield lambda doc: handle.write(json.dumps(doc) + "\n")
    tmp.replace(directory / "documents.jsonl")


def write_pool(products: Iterable[dict], out: Path, collection: Path | None) -> Path:
    """The store (and, with ``collection``, the index's documents) in one
    pass over ``products``."""
    pool_path = out / store.FILE_NAME
    if collection is None:
        store.write_store(products, pool_path)
        return pool_path
    with _collection_writer(collection) as write:

        def documented(items: Iterable[dict]) -> Iterator[dict]:
            for product in items:
                write(catalog.document(product))
                yield product

        store.write_store(documented(products), pool_path)
    return pool_path


def build_index(collection: Path, index: Path, java_home: str, threads: int = 1) -> None:
    """WebShop's indexing command, run on the Conda-style Java."""
    libjvm = javahome.check(java_home)
    if index.exists():
        shutil.rmtree(index)
    env = dict(os.environ, JAVA_HOME=str(java_home), JVM_PATH=str(libjvm))
    cmd = [
        sys.executable,
        "-m",
        "pyserini.index.lucene",
        "--collection",
        "JsonCollection",
        "--input",
        str(collection),
        "--index",
        str(index),
        "--generator",
        "DefaultLuceneDocumentGenerator",
        "--threads",
        str(threads),
        "--storePositions",
        "--storeDocvectors",
        "--storeRaw",
    ]
    with progress.ticking(f"shop: building the Lucene index {index}"):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(
            f"pyserini indexing failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout)[-2000:]}"
        )


def prepare(args: argparse.Namespace) -> dict:
    out = Path(args.output).resolve()
    # The goals (each task's target product) decide the reward.
    private_dir(out)
    db = Path(args.memoryarena_db).resolve() if args.memoryarena_db else None
    categories: dict[str, str] = {}
    products: Iterable[dict]
    if db is not None:
        products, categories = memoryarena_pool(db)
        if not args.index_dir:
            args.index_dir = str(db / "search_engine" / "indexes-full")
    else:
        products = iter_pool(args.catalog, args.instructions, args.human_instructions)
    javahome.check(args.java_home)  # before a long pass, not after it
    index = Path(args.index_dir).resolve() if args.index_dir else out / "index"
    pool_path = write_pool(products, out, None if args.index_dir else out / "collection")
    if not args.index_dir:
        build_index(out / "collection", index, args.java_home, args.threads)
    pool = store.ProductStore(pool_path)
    search.boot_jvm(args.java_home, args.jvm_heap_mb)
    searcher = search.Searcher(str(index), pool)
    try:
        search.verify_index(searcher, pool.documents(), full=not args.sample_index_check)
    finally:
        searcher.close()

    tasks = []
    splits = [s for s in args.splits.split(",") if s]
    unknown = set(splits) - {name for name, _, _ in goals.SPLITS}
    if unknown:
        raise ConfigError(f"unknown split(s) {', '.join(sorted(unknown))}")
    if args.goals != "none":
        goal_list = goals.generate(pool.goal_inputs(), source=args.goals, seed=args.goal_seed)
        tasks += goals.webshop_tasks(goal_list, source=args.goals, splits=splits)
    if args.exact_product_rows:
        with open(args.exact_product_rows, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    tasks.append(goals.exact_product_task(json.loads(line), number, pool))
    if args.memoryarena_rows:
        tasks += memoryarena.subtask_tasks(
            memoryarena.read_rows(args.memoryarena_rows), pool, categories
        )
    if not tasks:
        raise DatasetError(
            "no tasks: choose --goals synthetic|human, --exact-product-rows or --memoryarena-rows"
        )
    sampling = {
        "goal_source": args.goals,
        "goal_seed": args.goal_seed,
        "shuffle_seed": goals.SHUFFLE_SEED,
        "selected_splits": splits,
        "splits": {name: [start, stop] for name, start, stop in goals.SPLITS},
        "search_return_n": search.SEARCH_RETURN_N,
        "product_window": 10,
    }
    files = {"product_pool": pool_path, "index": index}
    body = manifest.build("shop", tasks, sampling=sampling, files=files, created_by=CREATED_BY)
    manifest.write(out / "manifest.json", body)
    settings = {
        "java_home": str(Path(args.java_home).resolve()),
        "product_pool": str(pool_path),
        "product_pool_sha256": body["files"]["product_pool"]["sha256"],
        "index_dir": str(index),
        "index_sha256": body["files"]["index"]["sha256"],
        "goal_seed": args.goal_seed,
        "jvm_heap_mb": args.jvm_heap_mb,
    }
    catalog.write_json(out / "settings.json", settings)
    return {
        "manifest": str(out / "manifest.json"),
        "settings": settings,
        "products": len(pool),
        "tasks": len(tasks),
        "selection_hash": manifest.load(out / "manifest.json").selection_hash(),
    }


def verify(args: argparse.Namespace) -> dict:
    out = Path(args.output).resolve()
    loaded = manifest.load(out / "manifest.json")
    loaded.verify_files()
    settings = _read_json(out / "settings.json")
    pool = store.ProductStore(loaded.files["product_pool"]["path"])
    goals.check_tasks(loaded.tasks, pool, loaded.sampling.get("goal_seed"))
    search.boot_jvm(settings.get("java_home", args.java_home), args.jvm_heap_mb)
    searcher = search.Searcher(loaded.files["index"]["path"], pool)
    try:
        search.verify_index(searcher, pool.documents(), full=not args.sample_index_check)
    finally:
        searcher.close()
    return {
        "verified": str(out / "manifest.json"),
        "products": len(pool),
        "tasks": len(loaded.tasks),
        "product_pool": loaded.files["product_pool"]["sha256"],
        "index": loaded.files["index"]["sha256"],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m camg.prepare_shop",
        description="Prepare the Shop environment (see module doc).",
    )
    p.add_argument("--output", required=True, help="directory for pool, index, manifest")
    p.add_argument("--java-home", help="Conda-style JAVA_HOME (scripts/prepare_java.py)")
    p.add_argument(
        "--catalog",
        default=str(DEFAULT_CATALOG),
        help="WebShop documents.jsonl(.gz) with processed products",
    )
    p.add_argument(
        "--instructions",
        default=str(DEFAULT_INSTRUCTIONS),
        help="items_ins_v2*.json (synthetic instructions); '' for none",
    )
    p.add_argument(
        "--human-instructions",
        default=str(DEFAULT_HUMAN),
        help="items_human_ins*.json; '' for none",
    )
    p.add_argument("--goals", choices=("synthetic", "human", "none"), default="synthetic")
    p.add_argument(
        "--goal-seed", type=int, default=0, help="seed of product prices and goal price caps"
    )
    p.add_argument(
        "--splits",
        default="test,eval,train",
        help="goal splits to serve (test 0-499, eval 500-1499, train 1500+)",
    )
    p.add_argument(
        "--exact-product-rows",
        help="JSONL of MemoryArena-style rows "
        "{instruction, target_asin(s), attributes|target_options}",
    )
    p.add_argument(
        "--memoryarena-rows",
        help="MemoryArena bundled_shopping rows (JSONL or "
        ".parquet): one task per subtask, in row then subtask order",
    )
    p.add_argument(
        "--memoryarena-db",
        help="a MemoryArena product DB directory (items_shuffle.json, "
        "items_ins_v2.json, search_engine/indexes-full, product_catalog/, "
        "domain_data.json) used instead of --catalog",
    )
    p.add_argument("--index-dir", help="use (and verify) this existing Lucene index")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jvm-heap-mb", type=int, default=1024)
    p.add_argument(
        "--sample-index-check",
        action="store_true",
        help="check the index by count and a sample, not every document",
    )
    p.add_argument("--verify", action="store_true", help="only verify OUTPUT")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not args.java_home and not args.verify:
            raise ConfigError("--java-home is required (build one with scripts/prepare_java.py)")
        result = verify(args) if args.verify else prepare(args)
    except (CamgError, OSError) as exc:
        print(f"prepare_shop: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
