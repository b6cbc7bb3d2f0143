"""Shop's BM25 search agrees with upstream WebShop's, hit for hit.

tests/support/shop_data/search_top50.json.gz holds, for 1150 goal
instructions of the 1k catalog, the top 50 that upstream's procedure
(pyserini 0.22.1 ``LuceneSearcher.search(q, k=50)``, each hit's raw
document's ``id``) returned through ``pyserini.search.lucene`` with its
dense-retrieval imports (torch, faiss, onnxruntime, transformers), before
issue 23 moved the service to Anserini's ``SimpleSearcher`` directly.
"""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from environments.shop import search
from tests.support import shop_testing as testing

GOLDEN = Path(__file__).resolve().parents[1] / "support" / "shop_data" / "search_top50.json.gz"


@pytest.fixture(scope="module")
def searcher():
    out, settings = testing.prepared()
    search.boot_jvm(settings["java_home"], testing.TEST_HEAP_MB)
    s = search.Searcher(settings["index_dir"], cache_entries=0)   # Lucene's answer every time
    yield s
    s.close()


def test_top50_equals_upstream_for_every_golden_query(searcher):
    rows = json.loads(gzip.decompress(GOLDEN.read_bytes()))["rows"]
    assert len(rows) == 1150
    differing = [row["query"] for row in rows if searcher.search(row["query"], k=50) != row["ids"]]
    assert not differing, f"{len(differing)} queries differ from upstream, e.g. {differing[:3]}"


def test_the_ranking_is_anserinis_simple_searchers(searcher):
    """Searcher.search reads the ids from Lucene's sort values; Anserini's
    SimpleSearcher.search loads every hit's document: the same hits."""
    rows = json.loads(gzip.decompress(GOLDEN.read_bytes()))["rows"]
    queries = [row["query"] for row in rows[:300]] + ["red shoes", "x", "and the of", "zzzz"]
    for k in (50, 10, 1):
        differing = [q for q in queries if searcher.search(q, k=k) != searcher.simple_search(q, k)]
        assert not differing, f"k={k}: {len(differing)} differ, e.g. {differing[:3]}"


def test_the_raw_document_is_the_upstream_one(searcher):
    first = json.loads(gzip.decompress(GOLDEN.read_bytes()))["rows"][0]["ids"][0]
    assert json.loads(searcher.raw(first))["id"] == first
    assert searcher.raw("no-such-asin") is None


def test_search_imports_no_dense_retrieval_module():
    # In a fresh process: the module fixture above already started a JVM here.
    code = ("import sys; from environments.shop import search; from tests.support import shop_testing as t;"
            "o, s = t.prepared(); search.boot_jvm(s['java_home'], t.TEST_HEAP_MB);"
            "x = search.Searcher(s['index_dir']); assert x.search('red shoes');"
            "print(sorted(m for m in ('torch', 'faiss', 'onnxruntime', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=testing.REPO, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
