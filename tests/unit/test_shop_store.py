"""The Shop product store (environments/shop/store.py) on the real 1k pool: it
round-trips every record exactly, draws the same prices and regenerates the
same goals as the pool held as dicts, and writes the same bytes twice (the
pool hash); the service's gate refuses a store it was not prepared with."""

import random
import shutil
import sqlite3

import pytest

from camg.environment import ServiceContext
from camg.errors import ConfigError, DatasetError
from camg.config.hashing import sha256_path
from camg.config import task_manifest as manifest
from environments.shop import catalog, goals, store
from environments.shop.environment import ShopEnvironment
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing


@pytest.fixture(scope="module")
def pool():
    return testing.pool()


@pytest.fixture(scope="module")
def written(pool, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / store.FILE_NAME
    assert store.write_store(pool, path) == len(pool) == 1000
    opened = ProductStore(path)
    yield path, opened
    opened.close()


def test_every_record_round_trips_exactly(pool, written):
    _, products = written
    assert list(products) == [p["asin"] for p in pool] and len(products) == 1000
    assert list(products.values()) == pool
    for product in pool:
        # every field pages and rewards read, with its type (ints stay ints)
        assert products[product["asin"]] == product
        assert products.rank(product["asin"]) == pool.index(product)
        assert product["asin"] in products
    assert "B000000000" not in products and 7 not in products
    with pytest.raises(KeyError):
        products["B000000000"]
    assert products.get("B000000000") is None


def test_option_values_prices_documents_and_goals_match_the_dicts(pool, written):
    _, products = written
    values = {v for p in pool for vs in p["options"].values() for v in vs}
    assert values and all(v in products.option_values for v in values)
    assert "no such option value" not in products.option_values
    expected = catalog.product_prices(pool, random.Random(3))
    prices = products.prices(random.Random(3))
    assert len(prices) == 1000 and all(prices[a] == expected[a] for a in expected)
    docs = products.documents()
    assert len(docs) == 1000 and docs[0] == catalog.document(pool[0])
    assert docs[::250] == [catalog.document(pool[i]) for i in (0, 250, 500, 750)]
    assert list(docs) == [catalog.document(p) for p in pool]
    for source in goals.GOAL_SOURCES:
        assert goals.generate(products.goal_inputs(), source=source, seed=0) == \
            goals.generate(pool, source=source, seed=0)


def test_the_same_pool_gives_the_same_bytes(pool, written, tmp_path):
    path, _ = written
    store.write_store(pool, tmp_path / "again.sqlite")
    assert sha256_path(tmp_path / "again.sqlite") == sha256_path(path)
    store.write_store(pool[1:] + pool[:1], tmp_path / "order.sqlite")
    assert sha256_path(tmp_path / "order.sqlite") != sha256_path(path)


def test_refusals(pool, tmp_path):
    with pytest.raises(DatasetError, match="duplicate ASIN"):
        store.write_store(pool[:3] + pool[:1], tmp_path / "dup.sqlite")
    assert not (tmp_path / "dup.sqlite").exists()
    with pytest.raises(DatasetError, match="no products"):
        store.write_store([], tmp_path / "empty.sqlite")
    (tmp_path / "pool.json").write_text("[]")
    with pytest.raises(ConfigError, match="not a Shop product store"):
        ProductStore(tmp_path / "pool.json")
    with pytest.raises(ConfigError, match="no product store"):
        ProductStore(tmp_path / "missing.sqlite")
    store.write_store(pool[:2], tmp_path / "old.sqlite")
    con = sqlite3.connect(tmp_path / "old.sqlite")
    con.execute("UPDATE meta SET value = 'camg-shop-store/0' WHERE key = 'format'")
    con.commit()
    con.close()
    with pytest.raises(ConfigError, match="store format"):
        ProductStore(tmp_path / "old.sqlite")


def test_the_pool_gate_refuses_another_selection_even_with_its_hash(pool, tmp_path):
    """A store of another selection (the same products, two goal products
    swapped) is refused by its hash; recorded with its own hash it is still
    refused: the goals regenerated from it differ from the served ones."""
    out, settings = testing.prepared()
    tasks = manifest.load(out / "manifest.json").tasks
    other = tmp_path / store.FILE_NAME
    swapped = list(pool)
    i, j = [n for n, p in enumerate(pool) if p.get("instruction_text")][:2]
    swapped[i], swapped[j] = swapped[j], swapped[i]
    store.write_store(swapped, other)

    def start(**overrides):
        env = ShopEnvironment(ServiceContext("shop", str(tmp_path), dict(
            settings, jvm_heap_mb=testing.TEST_HEAP_MB, **overrides)), tasks)
        try:
            env.start()
        finally:
            env.stop()

    with pytest.raises(ConfigError, match="product_pool (changed|.* differs)"):
        start(product_pool=str(other))
    with pytest.raises(ConfigError, match="goal differs"):
        start(product_pool=str(other), product_pool_sha256=sha256_path(other))
    # the prepared store itself still starts
    copy = tmp_path / "copy.sqlite"
    shutil.copy(settings["product_pool"], copy)
    start(product_pool=str(copy))
