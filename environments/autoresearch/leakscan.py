"""Answer lookup, checked before serving: a task's test rows anywhere the agent can read.

``camg.prepare --environment autoresearch --validate`` refuses a task whose
test rows (their feature vectors, or their ids) appear in the image rootfs
or in the task's public workspace outside the task's own test inputs. The
first demo set failed exactly this way: its test rows were scikit-learn's
bundled data sets, and the image shipped them (issue 29).

What counts as a test row: every data row of the public ``test.csv`` (first
column the id, the rest its features) and every item along the first axis
of a public ``test*.npy`` (flattened). A row is compared in a canonical
form — every value taken as float32 and rounded to 4 significant digits —
so a copy printed with other precision or stored as float32/float64/
integers still matches (a value on a rounding boundary printed with fewer
digits may not: a file needs only a few matching rows to count).

What is scanned: every regular file (no symlink followed) of the rootfs and
of the workspace but the test inputs themselves, whose name ends in a data
suffix (DATA_SUFFIXES or BINARY_SUFFIXES), or is gzip/bzip2/xz-compressed
with a data suffix or none inside (``data.gz``), outside SKIPPED_TREES
(documentation, locales, dpkg's state), and the members of
.npz/.zip archives: text is read as the stream of its numbers (tokens not
glued to letters, so an id such as ``bc0012`` is no number) and of its
words (for the ids); .npy/.npz as their arrays flattened; pickles and other
binary containers (BINARY_SUFFIXES) as raw little-endian float64, float32,
int64, int32 and uint8 at every alignment. A file holds a test row when the
row's values appear consecutively in its stream (any layout that keeps a
row's values together and in order: CSV with the label first or last,
JSON lists, row-major arrays); a file with at least ``min(3, rows)`` test
rows or test ids is a leak.

Limits (said in environments/autoresearch/README.md's threat model too): a
transformed copy — rescaled, columns permuted, values rounded to fewer than
4 significant digits, encrypted or in a format not listed — is not found;
neither are answers stored without their ids or features, nor data the
agent could regenerate from code (the demo tasks' generators and their
entropy are outside the sandbox for that reason); files above MAX_BYTES
(after decompression) are read up to that bound only.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import io
import lzma
import os
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

DATA_SUFFIXES = (
    ".csv",
    ".tsv",
    ".txt",
    ".dat",
    ".data",
    ".arff",
    ".json",
    ".jsonl",
    ".npy",
    ".npz",
    ".svm",
    ".libsvm",
    ".svmlight",
    ".names",
    ".test",
    ".train",
    ".zip",
)
BINARY_SUFFIXES = (".pkl", ".pickle", ".joblib", ".pt", ".pth", ".bin", ".mat")
COMPRESSED = {".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress}
# Documentation and system trees: prose, no data sets (and most of the
# image's compressed files: changelogs, manual pages).
SKIPPED_TREES = frozenset(
    {
        "proc",
        "sys",
        "dev",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "usr/share/i18n",
        "usr/share/zoneinfo",
        "var/lib/dpkg",
        "var/cache/debconf",
    }
)
MAX_BYTES = 128 << 20
KEY = 8  # consecutive values hashed per row
_PRIME = np.uint64(0x100000001B3)
_NUMBER = re.compile(rb"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_WORD = re.compile(rb"[A-Za-z0-9_\-]+")
_BINARY_VIEWS = (("<f8", 8), ("<f4", 4), ("<i8", 8), ("<i4", 4), ("u1", 1))


@dataclasses.dataclass(frozen=True)
class Leak:
    path: str  # as the agent sees it (rootfs- or workspace-relative, absolute)
    rows: int  # distinct test rows found in it
    ids: int  # distinct test ids found in it

    def __str__(self) -> str:
        return f"{self.path}: {self.rows} test row(s), {self.ids} test id(s)"


def canonical(values: np.ndarray) -> np.ndarray:
    """int64 codes of values rounded to 4 significant digits (0 for 0, -1 for NaN/inf).

    Through float32 first: a value on a rounding boundary (12.345) then rounds
    the same way in a float64 source, a float32 copy and its printed text."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(values, dtype=np.float64).ravel().astype(np.float32).astype(np.float64)
    out = np.full(v.shape, -1, dtype=np.int64)
    finite = np.isfinite(v)
    zero = finite & (v == 0)
    out[zero] = 0
    nz = finite & ~zero
    if nz.any():
        a = np.abs(v[nz])
        exp = np.floor(np.log10(a)).astype(np.int64)
        mant = np.rint(a / np.power(10.0, exp - 3)).astype(np.int64)
        carry = mant >= 10000
        mant[carry] //= 10
        exp[carry] += 1
        out[nz] = (mant * 2000 + (exp + 400) * 2 + (v[nz] < 0)) + 1
    return out


def _window_hashes(codes: np.ndarray, k: int) -> np.ndarray:
    h = np.zeros(max(len(codes) - k + 1, 0), dtype=np.uint64)
    if not len(h):
        return h
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * _PRIME + codes[j : len(codes) - k + 1 + j].astype(np.uint64)
    return h


class TestRows:
    """The rows to look for: canonical codes, one hashed anchor window each."""

    def __init__(self, rows: list[np.ndarray], ids: Iterable[str]) -> None:
        self.ids = {i.encode() for i in ids if i}
        self.codes, self.offsets, anchors = [], [], []
        for row in rows:
            codes = canonical(row)
            if len(codes) < 2 or len(set(codes.tolist())) < 3:
                continue  # a constant or near-constant row is no fingerprint
            k = min(KEY, len(codes))
            # the anchor: the window with the most distinct values (zeros are common)
            best = max(range(len(codes) - k + 1), key=lambda o: len(set(codes[o : o + k].tolist())))
            self.codes.append(codes)
            self.offsets.append(best)
            anchors.append((k, int(_window_hashes(codes[best : best + k], k)[0])))
        self.by_anchor: dict[tuple[int, int], list[int]] = {}
        for n, anchor in enumerate(anchors):
            self.by_anchor.setdefault(anchor, []).append(n)
        self.widths = sorted({k for k, _ in self.by_anchor})

    def __len__(self) -> int:
        return len(self.codes)

    def anchors(self, k: int) -> np.ndarray:
        return np.array([h for (w, h) in self.by_anchor if w == k], dtype=np.uint64)

    def found_at(
        self, codes: np.ndarray, k: int, hashes: np.ndarray, positions: np.ndarray
    ) -> set[int]:
        """The rows whose anchor of width ``k`` hashes as at ``positions``."""
        found: set[int] = set()
        for position in positions:
            for n in self.by_anchor.get((k, int(hashes[position])), ()):
                start = int(position) - self.offsets[n]
                row = self.codes[n]
                if start >= 0 and np.array_equal(codes[start : start + len(row)], row):
                    found.add(n)
        return found


def found_in(codes: np.ndarray, rowsets: Mapping[str, TestRows]) -> dict[str, set[int]]:
    """Per task the rows in one stream of canonical codes (one hash pass and
    one lookup per anchor width for every task at once)."""
    found: dict[str, set[int]] = {task: set() for task in rowsets}
    for k in sorted({k for rows in rowsets.values() for k in rows.widths}):
        hashes = _window_hashes(codes, k)
        wanted_k = np.concatenate([rows.anchors(k) for rows in rowsets.values()])
        positions = np.nonzero(np.isin(hashes, wanted_k))[0]
        if len(positions):
            for task, rows in rowsets.items():
                if k in rows.widths:
                    found[task] |= rows.found_at(codes, k, hashes, positions)
    return found


def task_test_rows(public: Path) -> tuple[TestRows, set[str]]:
    """The test rows of a task's public directory and the names of its test inputs."""
    rows: list[np.ndarray] = []
    ids: list[str] = []
    inputs: set[str] = set()
    test_csv = public / "test.csv"
    if test_csv.is_file():
        inputs.add("test.csv")
        with open(test_csv, newline="") as f:
            body = list(csv.reader(f))[1:]
        for r in body:
            if r:
                ids.append(r[0])
                rows.append(np.array([float(v) for v in r[1:]]))
    for path in sorted(public.glob("test*.npy")):
        inputs.add(path.name)
        array = np.load(path, allow_pickle=False)
        rows.extend(np.asarray(item, dtype=np.float64).ravel() for item in array)
    return TestRows(rows, ids), inputs


# -- reading files as streams ---------------------------------------------------


def _suffixes(name: str) -> tuple[str, str]:
    """(the compression suffix or "", the data suffix or "")."""
    lower = name.lower()
    compression = next((c for c in COMPRESSED if lower.endswith(c)), "")
    base = lower[: len(lower) - len(compression)] if compression else lower
    kind = next((s for s in DATA_SUFFIXES + BINARY_SUFFIXES if base.endswith(s)), "")
    return compression, kind


def wanted(name: str) -> bool:
    """A data file (also compressed), or a compressed file of no other suffix."""
    compression, kind = _suffixes(name)
    if compression:
        inner = name[: -len(compression)]
        return bool(kind) or "." not in inner.lstrip(".")
    return bool(kind)


def _streams(name: str, data: bytes) -> Iterator[tuple[np.ndarray, bytes]]:
    """(numbers, text or b"") of one file's content, by its name's suffixes."""
    compression, kind = _suffixes(name)
    if compression:
        try:
            data = COMPRESSED[compression](data)[:MAX_BYTES]
        except (OSError, EOFError, lzma.LZMAError, ValueError):
            return
    if kind in (".npy", ".npz", ".zip"):
        try:
            if kind == ".npy":
                arrays = [np.load(io.BytesIO(data), allow_pickle=False)]
            elif kind == ".npz":
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    arrays = [z[k] for k in z.files]
            else:
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for info in z.infolist()[:1000]:
                        if wanted(info.filename) and info.file_size <= MAX_BYTES:
                            yield from _streams(info.filename, z.read(info))
                return
        except (ValueError, OSError, zipfile.BadZipFile, EOFError):
            return
        for array in arrays:
            if array.dtype.kind in "biuf":
                yield array.astype(np.float64).ravel(), b""
        return
    if kind in BINARY_SUFFIXES:
        for dtype, size in _BINARY_VIEWS:
            for offset in range(size):
                usable = (len(data) - offset) // size * size
                if usable > 0:
                    with np.errstate(invalid="ignore", over="ignore"):
                        view = np.frombuffer(
                            data, dtype=dtype, offset=offset, count=usable // size
                        ).astype(np.float64)
                    yield view, b""
        return
    numbers = _NUMBER.findall(data)
    yield np.array([float(n) for n in numbers]) if numbers else np.zeros(0), data


def scan_file(path: Path, shown: str, rowsets: Mapping[str, TestRows]) -> dict[str, Leak]:
    """Per task (a key of ``rowsets``) the leak this file is, if it is one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES)
    except OSError:
        return {}
    found: dict[str, set[int]] = {task: set() for task in rowsets}
    ids: dict[str, set[bytes]] = {task: set() for task in rowsets}
    for numbers, text in _streams(path.name, data):
        words = set(_WORD.findall(text)) if text else set()
        if len(numbers):
            for task, hits in found_in(canonical(numbers), rowsets).items():
                found[task] |= hits
        for task, rows in rowsets.items():
            if rows.ids and words:
                ids[task] |= rows.ids & words
    leaks = {}
    for task, rows in rowsets.items():
        if len(found[task]) >= max(1, min(3, len(rows))) or len(ids[task]) >= max(
            1, min(3, len(rows.ids))
        ):
            leaks[task] = Leak(shown, len(found[task]), len(ids[task]))
    return leaks


def scan_tree(
    root: Path, rowsets: Mapping[str, TestRows], *, prefix: str = "/", skip: Iterable[str] = ()
) -> tuple[dict[str, list[Leak]], int]:
    """Per task the leaks under ``root`` (its files named as ``prefix`` +
    relative path) and how many files were read; ``skip``: relative paths
    left out."""
    skipped = set(skip)
    leaks: dict[str, list[Leak]] = {task: [] for task in rowsets}
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        here = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d for d in dirnames if os.path.normpath(os.path.join(here, d)) not in SKIPPED_TREES
        )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            relative = str(path.relative_to(root))
            if relative in skipped or not wanted(name) or path.is_symlink() or not path.is_file():
                continue
            scanned += 1
            for task, leak in scan_file(path, prefix + relative, rowsets).items():
                leaks[task].append(leak)
    return leaks, scanned
