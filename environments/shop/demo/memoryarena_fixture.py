"""Build a MemoryArena-shaped product DB and task rows for tests and demos.

    python -m environments.shop.demo.memoryarena_fixture --output DIR [--products 200] [--rows 3]
        [--java-home HOME]   # also build search_engine/indexes-full

MemoryArena's dataset and product DB declare no licence, so nothing of
them is copied: the builder writes files in the same *shape* (see
MemoryArena's published shopping split) from the shipped MIT-licensed WebShop 1k
catalog, and rows whose questions and attribute lists it composes itself:

* ``items_shuffle.json`` — raw scraped-product records (``name``,
  ``full_description``, ``small_description``, ``pricing`` as "$a - $b",
  ``customization_options``, ``images``, ``average_rating``, ...), the
  input MemoryArena's WebShop loader processes;
* ``items_ins_v2.json`` — per-ASIN ``attributes``;
* ``product_catalog/<top>_<second>.json`` — ``{asin | product_information.ASIN,
  product_category, name}`` lists, and ``domain_data.json``;
* ``search_engine/indexes-full`` — built as WebShop/MemoryArena build it
  (JsonCollection, DefaultLuceneDocumentGenerator, positions, docvectors, raw);
* ``rows.jsonl`` and ``rows.parquet`` — ``{id, questions[6], answers[6] =
  {target_asin, attributes[]}, category}``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from environments.shop import catalog
from environments.shop.prepare import DEFAULT_CATALOG, build_index, write_collection

SUBTASKS = 6
PREFIXES = ("baking", "beauty", "electronics", "grocery", "home")
SEPARATOR = "-" * 64


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "other"


def raw_record(product: dict, rng: random.Random) -> dict:
    pricing = product["pricing"]
    price = "$" + " - $".join(f"{p:.2f}" for p in pricing) if pricing else ""
    return {
        "asin": product["asin"],
        "name": product["Title"],
        "full_description": product["Description"],
        "small_description": product["BulletPoints"],
        "pricing": price,
        "customization_options": {
            name.title(): [{"value": v, "image": None} for v in values]
            for name, values in product["options"].items()
        }
        or None,
        "images": [product.get("MainImage") or "https://example.invalid/img.jpg"],
        "category": product["category"],
        "query": product["query"],
        "product_category": product["product_category"],
        "average_rating": rng.choice([None, "4.5", "3.9", "5.0"]),
    }


def question(preamble: str, k: int, product: dict) -> str:
    words = product["Title"].split()[:8]
    return f"{preamble}\n{SEPARATOR}\nProduct {k}: I am looking for {' '.join(words)}."


def answer(product: dict, rng: random.Random) -> dict:
    attributes = [a for a in product["Attributes"] if a != "DUMMY_ATTR"][:3]
    words = [w for w in re.findall(r"[A-Za-z][A-Za-z-]+", product["Title"]) if len(w) > 3]
    attributes += rng.sample(words, min(2, len(words)))
    return {"target_asin": product["asin"], "attributes": attributes or ["quality"]}


def build(
    output: Path, products: int = 200, rows: int = 3, seed: int = 0, java_home: str | None = None
) -> dict:
    rng = random.Random(seed)
    pool = catalog.select_products(
        catalog.read_catalog_documents(DEFAULT_CATALOG), str(DEFAULT_CATALOG)
    )[:products]
    output.mkdir(parents=True, exist_ok=True)
    (output / "items_shuffle.json").write_text(json.dumps([raw_record(p, rng) for p in pool]))
    (output / "items_ins_v2.json").write_text(
        json.dumps({p["asin"]: {"attributes": p["Attributes"]} for p in pool})
    )
    files: dict[str, list] = {}
    for n, p in enumerate(pool):
        segments = [s.strip() for s in p["product_category"].split("›")] + ["other", "other"]
        entry = {"asin": p["asin"]} if n % 2 else {"product_information": {"ASIN": p["asin"]}}
        entry.update(product_category=p["product_category"], name=p["Title"])
        files.setdefault(f"{_slug(segments[0])}_{_slug(segments[1])}.json", []).append(entry)
    (output / "product_catalog").mkdir(exist_ok=True)
    for name, entries in files.items():
        (output / "product_catalog" / name).write_text(json.dumps(entries))
    task_rows = []
    for row_id in range(rows):
        targets = rng.sample(pool, SUBTASKS)
        preamble = (
            f"You are a shopper buying {SUBTASKS} products for one project.\n"
            f"GLOBAL RULES: total budget ${rng.randint(100, 900)}; every product "
            "must work with the others."
        )
        task_rows.append(
            {
                "id": row_id,
                "category": f"{PREFIXES[row_id % len(PREFIXES)]}_item_{row_id}",
                "questions": [question(preamble, k, t) for k, t in enumerate(targets, 1)],
                "answers": [answer(t, rng) for t in targets],
            }
        )
    (output / "domain_data.json").write_text(
        json.dumps(
            [{"chain_id": r["category"], "path": [{"product_category": ""}]} for r in task_rows]
        )
    )
    with open(output / "rows.jsonl", "w", encoding="utf-8") as handle:
        for row in task_rows:
            handle.write(json.dumps(row) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(task_rows), output / "rows.parquet")
    index = output / "search_engine" / "indexes-full"
    if java_home:
        from environments.shop import memoryarena

        processed = memoryarena.process_products(
            json.loads((output / "items_shuffle.json").read_text()),
            json.loads((output / "items_ins_v2.json").read_text()),
        )
        write_collection(processed, output / "search_engine" / "resources")
        build_index(output / "search_engine" / "resources", index, java_home)
    return {
        "output": str(output),
        "products": len(pool),
        "rows": len(task_rows),
        "index": str(index) if java_home else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m environments.shop.demo.memoryarena_fixture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--output", required=True)
    p.add_argument("--products", type=int, default=200)
    p.add_argument("--rows", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--java-home", help="Conda-style JAVA_HOME: also build the index")
    args = p.parse_args(argv)
    print(json.dumps(build(Path(args.output), args.products, args.rows, args.seed, args.java_home)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
