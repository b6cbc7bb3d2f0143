"""Content digests as OCI spells them (``sha256:<64 hex>``) and hashing streams."""

from __future__ import annotations

import hashlib
import os
import re
from typing import BinaryIO

from camg.errors import DatasetError
from camg.hashing import sha256_bytes  # noqa: F401  (OCI code spells digests the same way)

_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_CHUNK = 1 << 20


def check_digest(value: object, what: str, error: type[Exception] = DatasetError) -> str:
    """Return ``value`` if it is a sha256 digest; other algorithms are refused
    because every digest we compare must be one we can recompute."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise error(f"{what}: {value!r} is not a sha256 digest (sha256:<64 lowercase hex>)")
    return value


def hex_of(digest: str) -> str:
    return digest.split(":", 1)[1]


def file_digest(path: str | os.PathLike) -> tuple[str, int]:
    """(digest, size) of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


class HashingReader:
    """A read-only stream that hashes everything read through it.

    tarfile stops at the end-of-archive marker; ``drain`` reads the padding
    after it so the digest covers the whole uncompressed layer, which is
    what a diff_id names.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._hash.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class HashingWriter:
    """A write-only stream that hashes everything written through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.size += len(data)
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()
