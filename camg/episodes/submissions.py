"""What finished episodes submitted, kept so they can be graded again.

``<state_dir>/submissions/<aa>/<sha256 hex>`` holds each distinct
submission once (content-addressed: a thousand identical empty diffs cost
one file). The outcome record names it (``submission: {sha256, bytes,
meta}``), so the record is the index and nothing else must stay in sync.

The store is bounded: past ``max_bytes`` the least recently stored blobs
are removed (down to 90 %, so eviction runs rarely). A regrade of an
episode whose bytes were evicted answers ``no_submission``; its outcome
records stay. Blobs are fsync'd before the record that names them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from camg import atomic
from camg.environment import Submission
from camg.errors import NoSubmission

log = logging.getLogger("camg.submissions")

#: default bound of one service's store (a Coding diff is typically a few
#: KiB, an AutoResearch CSV at most 8 MiB, Shop stores no bytes at all)
DEFAULT_MAX_BYTES = 4 << 30
META_MAX = 64 << 10


class SubmissionStore:
    def __init__(self, state_dir: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(state_dir) / "submissions"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._total = sum(size for _, _, size in self._blobs(sweep=True))

    def _blobs(self, sweep: bool = False):
        for sub in os.scandir(self.root):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(sub.path):
                if entry.name.startswith("."):  # blobs are named by their hex digest
                    if sweep:  # a write a killed process never finished
                        Path(entry.path).unlink(missing_ok=True)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    yield entry.path, st.st_mtime, st.st_size

    def _path(self, hexdigest: str) -> Path:
        return self.root / hexdigest[:2] / hexdigest

    def put(self, submission: Submission) -> dict:
        """Store ``submission``; the reference the outcome record carries."""
        meta = dict(submission.meta)
        if len(json.dumps(meta, default=str)) > META_MAX:
            raise ValueError(f"submission meta is larger than {META_MAX} bytes")
        ref: dict[str, Any] = {"sha256": None, "bytes": len(submission.data), "meta": meta}
        if not submission.data:
            return ref
        digest = hashlib.sha256(submission.data).hexdigest()
        ref["sha256"] = "sha256:" + digest
        path = self._path(digest)
        with self._lock:
            if path.exists():
                os.utime(path)  # stored again: the newest for eviction
                return ref
            path.parent.mkdir(exist_ok=True)
            atomic.write_bytes(path, submission.data, mode=0o600)
            self._total += len(submission.data)
            if self._total > self.max_bytes:
                self._evict(keep=path)
        return ref

    def _evict(self, keep: Path) -> None:
        blobs = sorted(self._blobs(), key=lambda b: b[1])
        self._total = sum(size for _, _, size in blobs)
        target = self.max_bytes * 9 // 10
        for path, _, size in blobs:
            if self._total <= target:
                break
            if path == str(keep):
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            self._total -= size
        log.info("submission store over %d bytes: evicted down to %d", self.max_bytes, self._total)

    def get(self, ref: Mapping[str, Any]) -> Submission:
        """The stored submission a record's ``submission`` names."""
        meta = dict(ref.get("meta") or {})
        sha = ref.get("sha256")
        if not sha:
            return Submission(b"", meta)
        digest = str(sha).removeprefix("sha256:")
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise NoSubmission(f"the record names no valid submission hash ({sha!r})")
        try:
            data = self._path(digest).read_bytes()
        except FileNotFoundError:
            raise NoSubmission(
                f"the submission {sha} is no longer stored (evicted: the store "
                f"keeps at most {self.max_bytes} bytes)"
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise NoSubmission(f"the stored submission {sha} is damaged")
        return Submission(data, meta)
