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
``SimpleSearcher.search(q, k)`` (pyserini 0.22.1, ``_searcher.py``), so the
hits are the same; tests/privileged/test_shop_search.py's upstream top-50
agreement checks it. pyserini is installed ``--no-deps`` for the same reason
(``requirements/README.md``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from camg.errors import ConfigError, PreparationMissing

from daemons.shop import javahome

#: WebShop: SEARCH_RETURN_N
SEARCH_RETURN_N = 50

_jvm_lock = threading.Lock()
_jvm_options: tuple[str, str] | None = None


def boot_jvm(java_home: str, heap_mb: int) -> None:
    """Start this process's JVM from ``java_home`` with a capped heap."""
    global _jvm_options
    wanted = (str(java_home), f"-Xmx{int(heap_mb)}m")
    with _jvm_lock:
        if _jvm_options is not None:
            if _jvm_options != wanted:
                raise ConfigError(f"this process already runs a JVM with {_jvm_options}; "
                                  f"it cannot start another with {wanted}")
            return
        libjvm = javahome.check(java_home)
        import jnius_config
        if jnius_config.vm_running:
            raise ConfigError("a JVM was started in this process outside the Shop search module; "
                              "its heap and Java cannot be checked")
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
        jnius_config.add_options(wanted[1], "-Xss8m", "-Djava.awt.headless=true",
                                 "-XX:-UsePerfData", "-Xrs", "-Dlog4j2.disable.jmx=true")
        # pyjnius logs a "Please report your system information" block at
        # INFO whenever JVM_PATH is set (kivy's logger): not ours to show.
        logging.getLogger("kivy").setLevel(logging.WARNING)
        # Puts the Anserini fat jar on the classpath, then starts the JVM.
        import pyserini.pyclass  # noqa: F401
        _jvm_options = wanted


def _simple_searcher():
    from jnius import autoclass
    return autoclass("io.anserini.search.SimpleSearcher")


class _TopIds:
    """``SimpleSearcher.search(q, k)``'s ranking without its stored documents.

    Anserini 0.22.1 (``SimpleSearcher._search``, no RM3/Rocchio) builds the
    query with ``BagOfWordsQueryGenerator`` and its analyzer, asks Lucene's
    ``IndexSearcher`` (its BM25 similarity) for the top k sorted by score,
    ties broken by the ``id`` field (``BREAK_SCORE_TIES_BY_DOCID``; a
    Lucene 8 index by plain score order instead), then loads every hit's
    stored document (``ScoredDocuments.fromTopDocs``: the raw product JSON,
    kilobytes each) only to read its ``id``; its ``ScoreTiesAdjusterReranker``
    changes scores, never the order. At 1.18 M products those 50 document
    loads were most of a search, so this asks Lucene the same question with
    the same analyzer, similarity and sort and reads the ids from the sort
    values. tests/unit/test_shop_search_golden.py checks it hit for hit
    against upstream's top 50, and against SimpleSearcher here.
    """

    def __init__(self, simple, index_dir: str) -> None:
        from jnius import autoclass, cast
        self._cast = cast
        self._lock = threading.Lock()
        self._field_doc = autoclass("org.apache.lucene.search.FieldDoc")
        self._bytes_ref = autoclass("org.apache.lucene.util.BytesRef")
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
            autoclass("org.apache.lucene.store.FSDirectory").open(
                autoclass("java.io.File")(str(index_dir)).toPath()))
        self._reader = reader
        searcher = autoclass("org.apache.lucene.search.IndexSearcher")(
            cast("org.apache.lucene.index.IndexReader", reader))
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
                sort_field("id", autoclass("org.apache.lucene.search.SortField$Type").STRING_VAL))

        # Every call search makes, once at start: a setup that cannot sort or
        # read ids fails here, not in an episode.
        self._ids(self._searcher.search(autoclass("org.apache.lucene.search.MatchAllDocsQuery")(),
                                        1, *((self._sort, True) if self._sort else ())))
        self.search("warm", 1)

    def search(self, keywords: str, k: int) -> list[str]:
        query = self._generator.buildQuery("contents", self._analyzer, keywords)
        if self._sort is None:
            top = self._searcher.search(query, k)
        else:
            # doDocScores False: SimpleSearcher asks True, which re-scores the
            # k hits afterwards (populateScores); the order and the ids come
            # from the sort values either way. 100k products: 15.5 -> 9.7 ms
            # of CPU per long query.
            top = self._searcher.search(query, k, self._sort, False)
        # pyjnius' casts and Object[] field reads of these results crashed
        # the JVM when episodes' threads ran them at once (SIGSEGV in
        # UnicodeUtil.UTF8toUTF16, NullPointerException): they take turns;
        # the Lucene search above, most of the time, does not.
        with self._lock:
            return self._ids(top)

    def _ids(self, top_docs) -> list[str]:
        if self._sort is None:
            return [self._searcher.doc(hit.doc).get("id") for hit in top_docs.scoreDocs]
        cast, field_doc, bytes_ref = self._cast, self._field_doc, self._bytes_ref
        return [cast(bytes_ref, cast(field_doc, hit).fields[1]).utf8ToString()
                for hit in top_docs.scoreDocs]

    def close(self) -> None:
        self._reader.close()


def jvm_heap_max_bytes() -> int:
    """The running JVM's max heap (Runtime.maxMemory), to prove the cap applies."""
    from jnius import autoclass
    return int(autoclass("java.lang.Runtime").getRuntime().maxMemory())


class Searcher:
    """BM25 top-50 over the index, as WebShop's ``get_top_n_product_from_keywords``.

    Thread-safe: Anserini's SimpleSearcher serves concurrent searches, and
    pyjnius attaches each calling thread to the JVM.
    """

    def __init__(self, index_dir: str, known_asins: frozenset[str] | None = None) -> None:
        if _jvm_options is None:
            raise ConfigError("boot_jvm must run before a Searcher is built")
        if not any(Path(index_dir).glob("segments_*")):
            raise PreparationMissing(f"no Lucene index at {index_dir}",
                                     step="python -m camg.prepare_shop --output DIR")
        self._searcher = _simple_searcher()(str(index_dir))
        self._top = _TopIds(self._searcher, index_dir)
        self.num_docs = int(self._searcher.get_total_num_docs())
        self._known = known_asins

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the top ``k`` hits that are in the product pool, in rank order.

        Upstream fetches each hit's stored raw document and reads its ``id``;
        for a JsonCollection index the Lucene docid *is* that ``id``, so we
        use it directly (``verify_index`` checks this for every document),
        read from the sort values without loading a document (``_TopIds``).
        """
        asins = self._top.search(keywords, int(k))
        if self._known is not None:
            asins = [a for a in asins if a in self._known]
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
