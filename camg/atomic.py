"""Atomic, durable file writes: the one way camg replaces a file.

The content goes to a temporary file beside the target, which is fsync'd,
renamed over the target, and then the directory is fsync'd so the rename
itself survives a crash: a reader sees the old file or the new one, never a
torn one, and after a power cut the new name is really there.

A leaf (standard library only): the root helper writes its ledger with it.
"""

from __future__ import annotations

import json
import os
from typing import Any


def write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> None:
    write_bytes(path, text.encode("utf-8"), mode=mode)


def write_json(
    path: str | os.PathLike,
    body: Any,
    *,
    indent: int | None = 1,
    sort_keys: bool = False,
    mode: int = 0o644,
) -> None:
    text = json.dumps(body, indent=indent, sort_keys=sort_keys, ensure_ascii=False) + "\n"
    write_bytes(path, text.encode("utf-8"), mode=mode)


def fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
