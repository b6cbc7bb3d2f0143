"""The product pool: WebShop's processed product records, their search
documents and their prices.

A product record is what WebShop's ``load_products`` produces (Title,
Description, BulletPoints, Price, pricing, options, Attributes, category,
query, product_category, name, Reviews, Rating, MainImage, ...). The pool
file is a store of those records in catalog order (environments/shop/store.py);
that order decides goal generation, so it is part of the pool hash.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from camg import atomic
from camg.errors import DatasetError

#: WebShop skips ASINs longer than this (``load_products``).
ASIN_MAX = 10
_REQUIRED_STR = (
    "asin",
    "Title",
    "Description",
    "Price",
    "category",
    "query",
    "product_category",
    "name",
)


def validate_product(product: Any, where: str) -> dict:
    """Check one processed record has the fields episodes and rewards read."""
    if not isinstance(product, Mapping):
        raise DatasetError(f"{where}: product must be an object")
    for key in _REQUIRED_STR:
        if not isinstance(product.get(key), str):
            raise DatasetError(f"{where}: field {key!r} must be a string")
    asin = product["asin"]
    if not asin or len(asin) > ASIN_MAX or not asin.isalnum():
        raise DatasetError(f"{where}: invalid asin {asin!r}")
    where = f"{where} ({asin})"
    bullets = product.get("BulletPoints")
    if not isinstance(bullets, list) or not bullets or not all(isinstance(b, str) for b in bullets):
        raise DatasetError(f"{where}: BulletPoints must be a non-empty list of strings")
    pricing = product.get("pricing")
    if (
        not isinstance(pricing, list)
        or len(pricing) > 2
        or not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in pricing)
    ):
        raise DatasetError(f"{where}: pricing must be a list of at most two numbers")
    options = product.get("options")
    if not isinstance(options, Mapping) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
        for k, v in options.items()
    ):
        raise DatasetError(f"{where}: options must map names to lists of strings")
    attrs = product.get("Attributes")
    if not isinstance(attrs, list) or not all(isinstance(a, str) for a in attrs):
        raise DatasetError(f"{where}: Attributes must be a list of strings")
    if not isinstance(product.get("Reviews", []), list):
        raise DatasetError(f"{where}: Reviews must be a list")
    return dict(product)


def document(product: Mapping[str, Any]) -> dict:
    """The pyserini JsonCollection document WebShop indexes for a product
    (search_engine/convert_product_file_format.py): title, description,
    first bullet point and the options, lowercased."""
    option_text = ", and ".join(
        f"{name}: {', '.join(values)}" for name, values in product["options"].items()
    )
    contents = " ".join(
        [product["Title"], product["Description"], product["BulletPoints"][0], option_text]
    ).lower()
    return {"id": product["asin"], "contents": contents, "product": product}


def read_json_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSON-lines file (.gz too); blank lines are
    skipped, anything but an object is a DatasetError naming the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        handle = opener(path, "rt", encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: expected an object")
            yield number, row


def read_catalog_documents(path: str | os.PathLike) -> Iterator[dict]:
    """Rows ``{id, contents, product}`` of a documents.jsonl(.gz) catalog."""
    for number, row in read_json_lines(path):
        if not isinstance(row.get("product"), dict):
            raise DatasetError(f"{path}:{number}: expected {{id, contents, product}}")
        yield row


def iter_products(rows: Iterable[Mapping], where: str) -> Iterator[dict]:
    """Validated products in catalog order, dropping what WebShop drops
    (duplicate ASINs; ASINs that are 'nan' or too long); one at a time, so
    a 1.18 M-product catalog is never a list in memory."""
    seen: set[str] = set()
    for index, row in enumerate(rows):
        product = row["product"]
        asin = product.get("asin") if isinstance(product, Mapping) else None
        if asin == "nan" or (isinstance(asin, str) and len(asin) > ASIN_MAX) or asin in seen:
            continue
        yield validate_product(product, f"{where} row {index}")
        assert isinstance(asin, str)  # validate_product accepted it
        seen.add(asin)


def select_products(rows: Iterable[Mapping], where: str) -> list[dict]:
    """``iter_products`` as a list; an empty catalog is a DatasetError."""
    products = list(iter_products(rows, where))
    if not products:
        raise DatasetError(f"{where}: no products")
    return products


def write_json(path: str | Path, body: Any) -> None:
    atomic.write_json(path, body, indent=None)


def draw_price(pricing: Sequence[float], rng: random.Random) -> float:
    """One product's price as WebShop's ``generate_product_prices`` draws it."""
    if not pricing:
        return 100.0
    if len(pricing) == 1:
        return float(pricing[0])
    return rng.uniform(*pricing[:2])


def product_prices(products: Iterable[Mapping[str, Any]], rng: random.Random) -> dict[str, float]:
    """WebShop's ``generate_product_prices`` on a seeded generator.

    A product with a price range gets a uniform draw inside it; upstream
    draws from the unseeded global generator, so every server start priced
    (and rewarded) differently. The draws happen in the same order as
    upstream, so seeding upstream's global generator with the same seed
    would give the same prices.
    """
    return {product["asin"]: draw_price(product["pricing"], rng) for product in products}
