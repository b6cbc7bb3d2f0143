"""The product pool as a compact store: one SQLite file (the standard
library's sqlite3), read by ASIN, instead of a Python dict per product.

WebShop's full catalog is 1,181,436 products; as Python dicts it took about
13 KB of resident memory each (15 GB). Here a product is a zlib-compressed
compact JSON record, decoded when a page, a reward or a check asks for it;
what the service keeps resident is SQLite's page cache, a small LRU of
decoded products and one float per product (the prices drawn at start).

``product_pool.sqlite`` holds, in catalog order (``rank``; that order
decides goal generation and price draws, so it is part of the pool hash):

* ``products`` -- rank, asin, the pricing numbers and which goal sources
  the product feeds, narrow so a start-up pass over 1.18 M rows (price draws,
  goal regeneration) never decodes a record;
* ``bodies`` -- rank -> the record (json round-trips it exactly: key order,
  ints, floats by repr);
* ``option_values`` -- every option value of any product (the store's
  ``unreachable_option`` rule asks membership);
* ``meta`` -- format and product count.

The file is written once, in one transaction, in catalog order, so the same
pool on the same SQLite gives the same bytes (its sha256 is the pool hash
the manifest records and the service checks). The service opens it
read-only and immutable: its hash was checked, nothing may write it.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sqlite3
import threading
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from camg.errors import ConfigError, DatasetError
from environments.shop import catalog

FORMAT = "camg-shop-store/1"
FILE_NAME = "product_pool.sqlite"
#: decoded products kept per store (a results page shows 10, an item page 1)
CACHE_PRODUCTS = 2048
_SYNTHETIC, _HUMAN = 1, 2
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE products (rank INTEGER PRIMARY KEY, asin TEXT NOT NULL UNIQUE,
                       n_pricing INTEGER NOT NULL, price_lo REAL, price_hi REAL,
                       goal_sources INTEGER NOT NULL);
CREATE TABLE bodies (rank INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE option_values (value TEXT PRIMARY KEY) WITHOUT ROWID;
"""


def _encode(product: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(product, ensure_ascii=False, separators=(",", ":")).encode(), 6)


def _goal_sources(product: Mapping[str, Any]) -> int:
    # the tests goals.generate applies: which products it cannot skip
    return (_SYNTHETIC if product.get("instruction_text") is not None else 0) | (
        _HUMAN if product.get("instructions") else 0
    )


def write_store(products: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> int:
    """Write validated products (catalog order) to a store at ``path``
    (atomically); returns their count. A duplicate ASIN is a DatasetError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp, isolation_level=None)
    count = 0
    try:
        # fixed page size, no journal: a fresh file written in one go
        con.execute("PRAGMA page_size=4096")
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.executescript(_SCHEMA)
        con.execute("BEGIN")
        for rank, product in enumerate(products):
            pricing = product["pricing"]
            try:
                con.execute(
                    "INSERT INTO products VALUES (?,?,?,?,?,?)",
                    (
                        rank,
                        product["asin"],
                        len(pricing),
                        pricing[0] if pricing else None,
                        pricing[1] if len(pricing) > 1 else None,
                        _goal_sources(product),
                    ),
                )
            except sqlite3.IntegrityError:
                raise DatasetError(
                    f"duplicate ASIN {product['asin']} in the product pool"
                ) from None
            con.execute("INSERT INTO bodies VALUES (?,?)", (rank, _encode(product)))
            con.executemany(
                "INSERT OR IGNORE INTO option_values VALUES (?)",
                ((v,) for vs in product["options"].values() for v in vs),
            )
            count = rank + 1
        if not count:
            raise DatasetError("no products")
        con.executemany(
            "INSERT INTO meta VALUES (?,?)", (("format", FORMAT), ("products", str(count)))
        )
        con.execute("COMMIT")
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        raise
    con.close()
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    tmp.replace(path)
    return count


class ProductStore(Mapping):
    """ASIN -> product record, read from a store file. Thread-safe (one
    connection under a lock: a lookup is microseconds). Records it returns
    are shared: callers must not modify them."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"no product store at {self.path}")
        try:
            self._con = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro&immutable=1",
                uri=True,
                check_same_thread=False,
            )
            meta = dict(self._con.execute("SELECT key, value FROM meta"))
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"{self.path} is not a Shop product store ({exc}); "
                "prepare again: python -m camg.prepare_shop"
            ) from None
        if meta.get("format") != FORMAT:
            raise ConfigError(
                f"{self.path}: store format {meta.get('format')!r}, "
                f"this service reads {FORMAT!r}; prepare again"
            )
        self._count = int(meta["products"])
        self._lock = threading.Lock()
        self._cached = functools.lru_cache(maxsize=CACHE_PRODUCTS)(self._read)
        self.option_values = _OptionValues(self)

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, args).fetchall()

    def _read(self, asin: str) -> dict | None:
        rows = self._query(
            "SELECT b.body FROM products p JOIN bodies b ON b.rank = p.rank WHERE p.asin = ?",
            (asin,),
        )
        return json.loads(zlib.decompress(rows[0][0])) if rows else None

    def __getitem__(self, asin: str) -> dict:
        product = self._cached(asin) if isinstance(asin, str) else None
        if product is None:
            raise KeyError(asin)
        return product

    def __contains__(self, asin: object) -> bool:
        return isinstance(asin, str) and bool(
            self._query("SELECT 1 FROM products WHERE asin = ?", (asin,))
        )

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        """ASINs in catalog order."""
        for (asin,) in self._stream("SELECT asin FROM products ORDER BY rank"):
            yield asin

    def values(self) -> Iterator[dict]:  # type: ignore[override]  # streams records, no ValuesView
        """Every record in catalog order (decoded one by one, not cached)."""
        for (body,) in self._stream("SELECT body FROM bodies ORDER BY rank"):
            yield json.loads(zlib.decompress(body))

    def rank(self, asin: str) -> int:
        rows = self._query("SELECT rank FROM products WHERE asin = ?", (asin,))
        if not rows:
            raise KeyError(asin)
        return rows[0][0]

    def _stream(self, sql: str, batch: int = 4096) -> Iterator[tuple]:
        # its own cursor on its own connection: a long pass never holds the
        # lock the episodes' lookups take
        con = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            cursor = con.execute(sql)
            while rows := cursor.fetchmany(batch):
                yield from rows
        finally:
            con.close()

    def _pricings(self) -> Iterator[tuple[str, list[float], int]]:
        for asin, n, lo, hi, sources in self._stream(
            "SELECT asin, n_pricing, price_lo, price_hi, goal_sources FROM products ORDER BY rank"
        ):
            yield asin, [lo, hi][:n], sources

    def goal_inputs(self) -> _GoalInputs:
        """What ``goals.generate`` reads, in catalog order, re-iterable:
        a product no goal source uses is only its asin and pricing."""
        return _GoalInputs(self)

    def prices(self, rng: random.Random) -> Prices:
        """``catalog.product_prices`` of the whole pool (the same draws in
        the same order), one float per product."""
        drawn = array("d", (catalog.draw_price(pricing, rng) for _, pricing, _ in self._pricings()))
        return Prices(self, drawn)

    def documents(self) -> Documents:
        return Documents(self)

    def close(self) -> None:
        with self._lock:
            self._con.close()


class _OptionValues:
    def __init__(self, store: ProductStore) -> None:
        self._store = store

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and bool(
            self._store._query("SELECT 1 FROM option_values WHERE value = ?", (value,))
        )


class _GoalInputs:
    def __init__(self, store: ProductStore) -> None:
        self._store = store

    def __len__(self) -> int:
        return len(self._store)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for asin, pricing, sources in self._store._pricings():
            yield self._store[asin] if sources else {"asin": asin, "pricing": pricing}


class Prices(Mapping):
    """ASIN -> the price drawn for it at start."""

    def __init__(self, store: ProductStore, drawn: array) -> None:
        self._store, self._drawn = store, drawn

    def __getitem__(self, asin: str) -> float:
        return self._drawn[self._store.rank(asin)]

    def __len__(self) -> int:
        return len(self._drawn)

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)


class Documents(Sequence):
    """The pool's search documents (``catalog.document``) by rank, built on
    demand: what ``search.verify_index`` compares with the index."""

    def __init__(self, store: ProductStore) -> None:
        self._store = store

    def __len__(self) -> int:
        return len(self._store)

    def __getitem__(self, index):
        if isinstance(index, slice):
            ranks = range(len(self))[index]
            return [self._document(rank) for rank in ranks]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._document(index)

    def __iter__(self) -> Iterator[dict]:
        return (catalog.document(p) for p in self._store.values())

    def _document(self, rank: int) -> dict:
        rows = self._store._query("SELECT body FROM bodies WHERE rank = ?", (rank,))
        return catalog.document(json.loads(zlib.decompress(rows[0][0])))
