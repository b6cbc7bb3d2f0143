"""Shop search's result cache and its concurrent uncached path: a cached
answer is the searched one (a copy, bounded, counted), and many threads
searching Lucene at once get what one thread gets."""

import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from environments.shop import search
from tests.support import shop_testing as testing

GOLDEN = Path(__file__).resolve().parents[1] / "support" / "shop_data" / "search_top50.json.gz"


@pytest.fixture(scope="module")
def index_dir():
    out, settings = testing.prepared()
    search.boot_jvm(settings["java_home"], testing.TEST_HEAP_MB)
    return settings["index_dir"]


@pytest.fixture(scope="module")
def queries():
    rows = json.loads(gzip.decompress(GOLDEN.read_bytes()))["rows"]
    return [row["query"] for row in rows[:200]]


def test_cached_answers_are_the_searched_ones(index_dir, queries):
    cold = search.Searcher(index_dir, cache_entries=0)
    cached = search.Searcher(index_dir, cache_entries=2 * len(queries))
    try:
        assert cold.cache is None
        expected = {(q, k): cold.search(q, k) for q in queries for k in (50, 10)}
        first = {(q, k): cached.search(q, k) for q in queries for k in (50, 10)}
        hits_after_first = cached.cache.hits
        again = {(q, k): cached.search(q, k) for q in queries[:100] for k in (50, 10)}
        assert first == expected
        assert again == {key: expected[key] for key in again}
        # the second pass was answered from the cache
        assert cached.cache.hits - hits_after_first == len(again)
        # a caller changing its list does not change the cache
        answer = cached.search(queries[-1], 50)
        answer.clear()
        assert cached.search(queries[-1], 50) == expected[(queries[-1], 50)]
        assert len(cached.cache._items) == 2 * len(queries)
    finally:
        cold.close()
        cached.close()


def test_the_cache_is_bounded_and_evicts_the_least_recent():
    results = search._Results(2)
    results.put(("a", 50), ("A",))
    results.put(("b", 50), ("B",))
    assert results.get(("a", 50)) == ("A",)
    results.put(("c", 50), ("C",))
    assert results.get(("b", 50)) is None
    assert results.get(("a", 50)) == ("A",) and results.get(("c", 50)) == ("C",)
    assert (results.hits, results.misses) == (3, 1)


def test_concurrent_uncached_searches_equal_one_threads(index_dir, queries):
    searcher = search.Searcher(index_dir, cache_entries=0)
    try:
        expected = [searcher.search(q) for q in queries]
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _ in range(2):
                assert list(pool.map(searcher.search, queries)) == expected
    finally:
        searcher.close()


def test_ids_in_one_call_equal_the_per_hit_reads(index_dir, queries):
    """The JSON form of the hits' sort values gives the ids the field-by-field
    pyjnius reads give, at k 50 and 1 and for a query without hits."""
    searcher = search.Searcher(index_dir, cache_entries=0)
    top = searcher._top
    try:
        for q in queries[:50] + ["zzzz", "and the of"]:
            for k in (50, 1):
                hits = top._searcher.search(
                    top._generator.buildQuery("contents", top._analyzer, q), k, top._sort, False)
                assert top._ids(hits) == top._ids_per_hit(hits)
    finally:
        searcher.close()
