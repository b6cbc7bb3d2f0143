"""Larger WebShop catalogs synthesised from the shipped 1k catalog, for the
scale benchmark (environments/shop/checks/bench_scale.py).

    python -m environments.shop.checks.synth_catalog --products 10000 \\
        --output docs.jsonl.gz [--seed 0]

The output is a documents.jsonl(.gz) catalog (``{id, contents, product}``
rows) holding the 1,000 real products first, unchanged (so their goals and
instructions still apply), then synthetic products until ``--products``.
Synthetic product i copies real product ``i mod 1000`` and perturbs what
search and reward read: a new ASIN (``X`` + 9 digits, never a real one), a
made-up brand in place of the title's first word, one title word dropped
or swapped with its neighbour, a variant suffix, one attribute dropped and
one borrowed from another product, and its price scaled by 0.8-1.25. Each
product's generator is seeded with (seed, i), so a catalog is the same
bytes on every machine and the first N products of a larger catalog are
the smaller one.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from environments.shop import catalog
from environments.shop.prepare import DEFAULT_CATALOG

_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ren",
    "to",
    "vex",
    "zu",
    "bri",
    "cor",
    "dan",
    "el",
    "fy",
    "gra",
    "hol",
    "iv",
    "jun",
    "kel",
    "lum",
    "nor",
    "pax",
    "qui",
    "sol",
    "tev",
    "ul",
)
_SUFFIXES = (
    "Pack of 2",
    "Pack of 3",
    "2024 Edition",
    "Value Bundle",
    "Travel Size",
    "Large",
    "Compact",
    "Deluxe",
    "Classic",
    "Pro",
    "Lite",
    "Set of 4",
)
_ASIN_PREFIX = "X"


def brand(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _price_tag(pricing: list[float]) -> str:
    # upstream load_products: "$a" or "$a to $b"
    if len(pricing) == 1:
        return f"${pricing[0]}"
    return f"${pricing[0]} to ${pricing[1]}"


def perturb(base: dict, index: int, seed: int, donors: Sequence[dict]) -> dict:
    rng = random.Random(f"{seed}:{index}")
    product = copy.deepcopy(base)
    for key in ("instruction_text", "instruction_attributes", "instructions"):
        product.pop(key, None)
    product["asin"] = f"{_ASIN_PREFIX}{index:09d}"
    words = base["Title"].split()
    if words:
        words[0] = brand(rng)
    if len(words) > 3:
        at = rng.randrange(1, len(words) - 1)
        if rng.random() < 0.5:
            del words[at]
        else:
            words[at], words[at + 1] = words[at + 1], words[at]
    words.append(rng.choice(_SUFFIXES))
    product["Title"] = product["name"] = " ".join(words)
    attributes = list(base["Attributes"])
    if len(attributes) > 1:
        del attributes[rng.randrange(len(attributes))]
    borrowed = rng.choice(donors)["Attributes"]
    if borrowed:
        attributes.append(rng.choice(borrowed))
    product["Attributes"] = attributes
    factor = rng.uniform(0.8, 1.25)
    if base.get("pricing"):
        product["pricing"] = [round(p * factor, 2) for p in base["pricing"]]
        product["Price"] = _price_tag(product["pricing"])
    return product


def synthesize(real: Sequence[dict], total: int, seed: int = 0) -> Iterator[dict]:
    """Products of a ``total``-product catalog: ``real`` first, then synthetic."""
    if total < len(real):
        raise ValueError(f"--products must be at least the {len(real)} real products")
    yield from real
    for index in range(len(real), total):
        yield perturb(real[index % len(real)], index, seed, real)


def write_catalog(products: Iterator[dict], output: Path) -> int:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    count = 0
    opener = gzip.open if output.suffix == ".gz" else open
    # no name, mtime=0: the same products give the same bytes
    with open(tmp, "wb") as raw:
        handle = (
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0)
            if opener is gzip.open
            else raw
        )
        for product in products:
            doc = catalog.document(product)
            handle.write((json.dumps(doc, ensure_ascii=False) + "\n").encode())
            count += 1
        if handle is not raw:
            handle.close()
    tmp.replace(output)
    return count


def real_products(path: str | Path = DEFAULT_CATALOG) -> list[dict]:
    return catalog.select_products(catalog.read_catalog_documents(path), str(path))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m environments.shop.checks.synth_catalog",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--products", type=int, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--catalog", default=str(DEFAULT_CATALOG), help="the real catalog to grow")
    args = p.parse_args(argv)
    try:
        count = write_catalog(
            synthesize(real_products(args.catalog), args.products, args.seed), Path(args.output)
        )
    except (ValueError, OSError) as exc:
        print(f"synth_catalog: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"output": args.output, "products": count}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
