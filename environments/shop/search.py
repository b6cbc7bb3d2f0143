"""WebShop's search engine: Anserini's BM25 ``SimpleSearcher`` (the Java
class pyserini's ``LuceneSearcher`` wraps) on the prepared Lucene index,
with one JVM per process.

pyjnius starts the JVM the first time ``jnius`` is imported and a process
can never start a second one, so the JVM options (heap cap, which libjvm)
are fixed once per process by ``boot_jvm``; a later call asking for
different options is refused instead of silently running with the first.

The searcher is the Java class itself, reached through ``pyserini.pyclass``
(the pyserini wheel's Anserini fat jar on the classpath), not through
``pyserini.search.lucene``: that package's ``__init__`` imports the dense
searchers (torch, faiss, onnxruntime, transformers), which BM25 never uses.
For a string query without fields ``LuceneSearcher.search`` is exactly
``SimpleSearcher.search(q, k)`` (pyserini 0.24.0, ``_searcher.py``), so the
hits are the same; tests/privileged/test_shop_search.py's upstream top-50
agreement checks it. pyserini is installed ``--no-deps`` for the same reason
(``requirements/README.md``).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Container, Sequence
from pathlib import Path
from typing import cast

from camg.errors import ConfigError, PreparationMissing
from environments.shop import javahome

#: WebShop: SEARCH_RETURN_N
SEARCH_RETURN_N = 50
#: results kept per Searcher (keywords, k) -> ids: about 3.5 KB each
SEARCH_CACHE_ENTRIES = 2048

_jvm_lock = threading.Lock()
_jvm_options: tuple[str, str] | None = None


def boot_jvm(java_home: str, heap_mb: int) -> None:
    """Start this process's JVM from ``java_home`` with a capped heap."""
    global _jvm_options
    wanted = (str(java_home), f"-Xmx{int(heap_mb)}m")
    with _jvm_lock:
        if _jvm_options is not None:
            if _jvm_options != wanted:
                raise ConfigError(
                    f"this process already runs a JVM with {_jvm_options}; "
                    f"it cannot start another with {wanted}"
                )
            return
        libjvm = javahome.check(java_home)
        import jnius_config

        if jnius_config.vm_running:
            raise ConfigError(
                "a JVM was started in this process outside the Shop search module; "
                "its heap and Java cannot be checked"
            )
        # pyjnius reads these when it loads libjvm; JVM_PATH pins the exact
        # library so the Conda-style layout is what runs, not a JDK found on PATH.
        os.environ["JAVA_HOME"] = str(java_home)
        os.environ["JVM_PATH"] = str(libjvm)
        # -XX:-UsePerfData: no /tmp/hsperfdata_<user> files from an unprivileged daemon.
        # -Xrs: the JVM leaves SIGTERM/SIGINT to Python; otherwise its own
        # handler exits the worker (status 143) mid graceful shutdown.
        # -Dlog4j2.disable.jmx: Anserini's log4j registers MBeans, which reads
        # the cgroup hierarchy; under systemd-nspawn's cgroup v1 layout that
        # prints a "Could not reconfigure JMX" stack trace at every start.
        jnius_config.add_options(
            wanted[1],
            "-Xss8m",
            "-Djava.awt.headless=true",
            "-XX:-UsePerfData",
            "-Xrs",
            "-Dlog4j2.disable.jmx=true",
        )
        # pyjnius logs a "Please report your system information" block at
        # INFO whenever JVM_PATH is set (kivy's logger): not ours to show.
        logging.getLogger("kivy").setLevel(logging.WARNING)
        # Puts the Anserini fat jar on the classpath, then starts the JVM.
        import pyserini.pyclass  # noqa: F401  # imported for its side effect, the started JVM

        _jvm_options = wanted


def _simple_searcher():
    from jnius import autoclass

    return autoclass("io.anserini.search.SimpleSearcher")


class _TopIds:
    """``SimpleSearcher.search(q, k)``'s ranking without its stored documents.

    Anserini 0.24.0 (``SimpleSearcher._search``, no RM3/Rocchio) builds the
    query with ``BagOfWordsQueryGenerator`` and its analyzer, asks Lucene's
    ``IndexSearcher`` (its BM25 similarity) for the top k sorted by score,
    ties broken by the ``id`` field (``BREAK_SCORE_TIES_BY_DOCID``; a
    Lucene 8 index by plain score order instead), then loads every hit's
    stored document (``ScoredDocs.fromTopDocs``: the raw product JSON,
    kilobytes each) only to read its ``id``; its ``ScoreTiesAdjusterReranker``
    changes scores, never the order. At 1.18 M products those 50 document
    loads were most of a search, so this asks Lucene the same question with
    the same analyzer, similarity and sort and reads the ids from the sort
    values. tests/unit/test_shop_search_golden.py checks it hit for hit
    against upstream's top 50, and against SimpleSearcher here. Lucene 9.9
    (Anserini 0.24) scores the disjunction of a long query with MaxScore
    where 9.5 (0.22.1) used WAND: the same hits for a fraction of the work.
    """

    def __init__(self, simple, index_dir: str, threads: int = 1) -> None:
        from jnius import autoclass, cast

        self._cast = cast
        self._lock = threading.Lock()
        self._field_doc = autoclass("org.apache.lucene.search.FieldDoc")
        self._bytes_ref = autoclass("org.apache.lucene.util.BytesRef")
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
            autoclass("org.apache.lucene.store.FSDirectory").open(
                autoclass("java.io.File")(str(index_dir)).toPath()
            )
        )
        self._reader = reader
        self.segments = int(reader.leaves().size())
        index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
        self._pool = None
        searcher = None
        if threads > 1 and self.segments > 1:
            # Lucene searches its slices (segments of > 250k documents, or
            # up to 5 smaller ones) on the pool, the last on the calling
            # thread, then merges the slices' top k by the same sort: the
            # same hits (BM25's statistics are the whole index's, and the
            # sort is total: score, then the unique id). A ForkJoinPool's
            # workers are daemon threads: none keeps the process alive.
            self._pool = autoclass("java.util.concurrent.ForkJoinPool")(int(threads))
            searcher = index_searcher(
                cast("org.apache.lucene.index.IndexReader", reader),
                cast("java.util.concurrent.Executor", self._pool),
            )
            if len(searcher.getSlices()) < 2:
                # one slice (the 1k and 100k indexes): the executor's path
                # only cost more (the scale benchmark: 100k 6.5 against 5.2 ms)
                self._pool.shutdown()
                self._pool = searcher = None
        if searcher is None:
            searcher = index_searcher(cast("org.apache.lucene.index.IndexReader", reader))
        self.threads = int(threads) if self._pool is not None else 1
        searcher.setSimilarity(simple.get_similarity())
        self._searcher = searcher
        self._analyzer = simple.get_analyzer()
        self._generator = autoclass("io.anserini.search.query.BagOfWordsQueryGenerator")()
        sort_field = autoclass("org.apache.lucene.search.SortField")
        self._sort = None
        # SimpleSearcher's own test for an index it reads in Lucene 8 compatibility
        if "lucene.version=9" in reader.toString():
            self._sort = autoclass("org.apache.lucene.search.Sort")(
                sort_field.FIELD_SCORE,
                sort_field("id", autoclass("org.apache.lucene.search.SortField$Type").STRING_VAL),
            )
        self._collectors = autoclass("org.apache.lucene.search.TopFieldCollector")
        # The hits' sort values in one call: Jackson (in the Anserini jar)
        # writes the TopFieldDocs' public fields as JSON, the id a BytesRef
        # (base64 bytes, offset, length). Reading them field by field through
        # pyjnius was 4 crossings and 2 casts per hit (1.4-1.9 ms for 50).
        mapper = autoclass("com.fasterxml.jackson.databind.ObjectMapper")()
        accessor = autoclass("com.fasterxml.jackson.annotation.PropertyAccessor")
        visibility = autoclass("com.fasterxml.jackson.annotation.JsonAutoDetect$Visibility")
        mapper.setVisibility(accessor.ALL, visibility.NONE)
        mapper.setVisibility(accessor.FIELD, visibility.PUBLIC_ONLY)
        mapper.disable(
            autoclass("com.fasterxml.jackson.databind.SerializationFeature").FAIL_ON_EMPTY_BEANS
        )  # SortField has no public instance field
        self._json = mapper

        # Every call search makes, once at start: a setup that cannot sort or
        # read ids fails here, not in an episode.
        match_all = autoclass("org.apache.lucene.search.MatchAllDocsQuery")()
        top = self._searcher.search(match_all, 1, *((self._sort, True) if self._sort else ()))
        if self._sort is not None and self._ids(top) != self._ids_per_hit(top):
            raise ConfigError("the JSON form of Lucene's sort values does not give the ids")
        self.search("warm", 1)

    def search(self, keywords: str, k: int) -> list[str]:
        query = self._generator.buildQuery("contents", self._analyzer, keywords)
        if self._sort is None:
            top = self._searcher.search(query, k)
        else:
            # SimpleSearcher's search(query, k, sort, true), but for two
            # things that change no hit: no doc scores (it re-scores the k
            # hits afterwards, populateScores; the order and the ids come from
            # the sort values either way: 100k products, 15.5 -> 9.7 ms of CPU
            # per long query), and the collectors skip non-competitive
            # documents once k hits are in instead of after 1,000 (Lucene's
            # TOTAL_HITS_THRESHOLD, which only makes the total hit count
            # exact, a number nothing here reads).
            top = self._searcher.search(
                query, self._collectors.createSharedManager(self._sort, k, None, k)
            )
        # pyjnius' casts and Object[] field reads of these results crashed
        # the JVM when episodes' threads ran them at once (SIGSEGV in
        # UnicodeUtil.UTF8toUTF16, NullPointerException): they take turns;
        # the Lucene search above, most of the time, does not.
        with self._lock:
            return self._ids(top)

    def _ids(self, top_docs) -> list[str]:
        if self._sort is None:
            return [self._searcher.doc(hit.doc).get("id") for hit in top_docs.scoreDocs]
        ids = []
        for hit in json.loads(self._json.writeValueAsString(top_docs))["scoreDocs"]:
            ref = hit["fields"][1]
            start = ref["offset"]
            ids.append(base64.b64decode(ref["bytes"])[start : start + ref["length"]].decode())
        return ids

    def _ids_per_hit(self, top_docs) -> list[str]:
        cast, field_doc, bytes_ref = self._cast, self._field_doc, self._bytes_ref
        return [
            cast(bytes_ref, cast(field_doc, hit).fields[1]).utf8ToString()
            for hit in top_docs.scoreDocs
        ]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._reader.close()


class _Results:
    """An LRU of finished searches, (keywords, k) -> ids. Exact: the index
    cannot change under a running Searcher (its hash is checked at start),
    and a search is a function of its keywords and k. The same goal
    instruction recurs across a GRPO group's episodes."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, int], tuple[str, ...]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> tuple[str, ...] | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, int], ids: tuple[str, ...]) -> None:
        with self._lock:
            self._items[key] = ids
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def jvm_heap_max_bytes() -> int:
    """The running JVM's max heap (Runtime.maxMemory), to prove the cap applies."""
    from jnius import autoclass

    return int(autoclass("java.lang.Runtime").getRuntime().maxMemory())


class Searcher:
    """BM25 top-50 over the index, as WebShop's ``get_top_n_product_from_keywords``.

    Thread-safe: Anserini's SimpleSearcher serves concurrent searches, and
    pyjnius attaches each calling thread to the JVM. ``threads``: a search
    over an index of several segments runs on that many threads (default:
    this process's cores; 1: on the calling thread alone). ``cache_entries``:
    finished searches kept (0: none).
    """

    def __init__(
        self,
        index_dir: str,
        known_asins: Container[str] | None = None,
        *,
        threads: int | None = None,
        cache_entries: int = SEARCH_CACHE_ENTRIES,
    ) -> None:
        if _jvm_options is None:
            raise ConfigError("boot_jvm must run before a Searcher is built")
        if not any(Path(index_dir).glob("segments_*")):
            raise PreparationMissing(
                f"no Lucene index at {index_dir}", step="python -m camg.prepare_shop --output DIR"
            )
        self._searcher = _simple_searcher()(str(index_dir))
        if threads is None:
            threads = len(os.sched_getaffinity(0))
        top = _TopIds(self._searcher, index_dir, max(1, int(threads)))
        self._top: _TopIds | None = top
        self.num_docs = int(self._searcher.get_total_num_docs())
        self.segments, self.threads = top.segments, top.threads
        self._known = known_asins
        self.cache = _Results(cache_entries) if cache_entries > 0 else None

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the top ``k`` hits that are in the product pool, in rank order.

        Upstream fetches each hit's stored raw document and reads its ``id``;
        for a JsonCollection index the Lucene docid *is* that ``id``, so we
        use it directly (``verify_index`` checks this for every document),
        read from the sort values without loading a document (``_TopIds``).
        A search asked before is answered from ``cache``.
        """
        key = (keywords, int(k))
        if self.cache is not None:
            found = self.cache.get(key)
            if found is not None:
                return list(found)
        # close() drops it: a search after close fails as it always has
        asins = cast(_TopIds, self._top).search(keywords, int(k))
        if self._known is not None:
            asins = [a for a in asins if a in self._known]
        if self.cache is not None:
            self.cache.put(key, tuple(asins))
        return asins

    def raw(self, docid: str) -> str | None:
        doc = self._searcher.doc(docid)
        return None if doc is None else doc.get("raw")

    def simple_search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """Anserini's own ``SimpleSearcher.search`` ids (what ``search``
        must equal, for the tests)."""
        # Positional: pyjnius drops keyword arguments of a Java method.
        return [hit.docid for hit in self._searcher.search(keywords, int(k))]

    def close(self) -> None:
        top, self._top = getattr(self, "_top", None), None
        if top is not None:
            top.close()
        searcher, self._searcher = getattr(self, "_searcher", None), None
        if searcher is not None:
            searcher.close()


def verify_index(searcher: Searcher, expected: Sequence[dict], *, full: bool = True) -> None:
    """Check the index holds exactly the expected JsonCollection documents.

    ``full`` compares every stored raw document with the expected one (id and
    contents); otherwise only the document count and a sample are checked
    (for the 1.18M-product catalog, where a full pass takes minutes).
    """
    if searcher.num_docs != len(expected):
        raise ConfigError(f"index holds {searcher.num_docs} documents, the pool {len(expected)}")
    sample = expected if full else expected[:: max(1, len(expected) // 1000)]
    for doc in sample:
        raw = searcher.raw(doc["id"])
        if raw is None:
            raise ConfigError(f"index has no document {doc['id']!r}")
        stored = json.loads(raw)
        if stored.get("id") != doc["id"] or stored.get("contents") != doc["contents"]:
            raise ConfigError(f"index document {doc['id']!r} differs from the product pool")
