"""Content digests as OCI spells them (``sha256:<64 hex>``) and hashing streams."""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

# The services check digests too (camg.oci.images); OCI code spells them the same way.
from camg.config.hashing import check_digest, sha256_bytes  # noqa: F401

_CHUNK = 1 << 20


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
