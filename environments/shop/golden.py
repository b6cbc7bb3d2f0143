"""Score a golden reward table with the service's reward code.

    python -m environments.shop.golden FILE [--column upstream|upstream_without_spacy]
                                       [--catalog documents.jsonl(.gz)] [--verbose]

FILE is JSON lines in the format of WebShop's reward golden table: a header
line (``{"header": true, ...}``), then one case a line with ``goal`` (the goal
exactly as upstream ``get_reward`` receives it), ``purchase`` (``asin``,
``options``, ``price``) and, under each column name, upstream's ``reward``
and its components. The purchased product is the ``product`` record of the
catalog row with that ASIN (default: the shipped 1k catalog).

Each case is run through ``rewards.webshop_reward`` and its reward compared
with the column's within 1e-6. The last line printed is
``equal N/M max_reward X`` (X: the largest reward the service computed);
the exit status is 0 only when every case is equal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from camg.errors import DatasetError
from environments.shop import catalog, rewards
from environments.shop.prepare import DEFAULT_CATALOG

COLUMNS = ("upstream", "upstream_without_spacy")
TOLERANCE = 1e-6
#: components compared besides the reward (booleans and numbers)
COMPONENTS = (
    "r_type",
    "r_att",
    "w_att",
    "query_match",
    "category_match",
    "title_score",
    "r_option",
    "w_option",
    "r_price",
    "w_price",
)


def read_cases(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, case) for every non-header line."""
    for number, row in catalog.read_json_lines(path):
        if row.get("header") is True:
            continue
        for key in ("goal", "purchase"):
            if not isinstance(row.get(key), dict):
                raise DatasetError(f"{path}:{number}: {key!r} must be an object")
        yield number, row


def products_by_asin(path: str | Path) -> dict[str, dict]:
    return {
        row["product"]["asin"]: row["product"]
        for row in catalog.read_catalog_documents(path)
        if isinstance(row["product"].get("asin"), str)
    }


def score_case(case: Mapping[str, Any], products: Mapping[str, Mapping]) -> tuple[float, dict]:
    purchase = case["purchase"]
    product = products.get(purchase.get("asin"))
    if product is None:
        raise DatasetError(f"purchase asin {purchase.get('asin')!r} is not in the catalog")
    return rewards.webshop_reward(
        product, case["goal"], float(purchase["price"]), dict(purchase.get("options") or {})
    )


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return ours == theirs
    if isinstance(theirs, (int, float)) and isinstance(ours, (int, float)):
        return abs(ours - theirs) <= TOLERANCE
    return ours == theirs


def compare(
    path: str | Path, column: str, catalog_path: str | Path, out=sys.stdout, verbose: bool = False
) -> tuple[int, int, float]:
    """(equal, total, max reward); prints one line per differing case."""
    products = products_by_asin(catalog_path)
    equal = total = 0
    max_reward = 0.0
    for number, case in read_cases(path):
        expected = case.get(column)
        if not isinstance(expected, dict) or not isinstance(expected.get("reward"), (int, float)):
            raise DatasetError(f"{path}:{number}: no {column}.reward")
        try:
            reward, info = score_case(case, products)
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{path}:{number}: cannot score: {exc!r}") from None
        total += 1
        max_reward = max(max_reward, reward)
        differing = [
            k
            for k in COMPONENTS
            if (k in expected or k in info) and not _same(info.get(k), expected.get(k))
        ]
        if abs(reward - expected["reward"]) <= TOLERANCE:
            equal += 1
            if verbose and differing:
                print(f"line {number}: equal reward, components differ: {differing}", file=out)
        else:
            print(
                f"line {number} {case.get('kind', '')}: reward {reward!r} expected "
                f"{expected['reward']!r}; differing {differing}",
                file=out,
            )
    return equal, total, max_reward


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m environments.shop.golden",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file")
    p.add_argument("--column", choices=COLUMNS, default="upstream_without_spacy")
    p.add_argument("--catalog", default=str(DEFAULT_CATALOG))
    p.add_argument(
        "--verbose", action="store_true", help="also list equal rewards whose components differ"
    )
    args = p.parse_args(argv)
    try:
        equal, total, max_reward = compare(
            args.file, args.column, args.catalog, verbose=args.verbose
        )
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"equal {equal}/{total} max_reward {max_reward!r}")
    return 0 if equal == total and total else 1


if __name__ == "__main__":
    sys.exit(main())
