"""Content hashes that bind a configuration to what is installed.

Every hash is ``sha256:<hex>``. Trees hash the sorted list of
(relative path, kind, content hash or link target), so a renamed file, a
changed symlink or a new empty directory changes the hash, while mtimes and
inode numbers do not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from camg.errors import ConfigError, DatasetError

_CHUNK = 1 << 20
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(value: object, what: str, error: type[Exception] = DatasetError) -> str:
    """Return ``value`` if it is a sha256 digest; other algorithms are refused
    because every digest we compare must be one we can recompute."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise error(f"{what}: {value!r} is not a sha256 digest (sha256:<64 lowercase hex>)")
    return value


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def sha256_tree(root: str | os.PathLike) -> str:
    """Hash a directory tree without following symlinks."""
    root = Path(root)
    entries = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(root)
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(rel_dir / name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                entries.append([rel, "link", os.readlink(path)])
            elif stat.S_ISDIR(mode):
                entries.append([rel, "dir", ""])
            elif stat.S_ISREG(mode):
                entries.append([rel, "file", sha256_file(path)])
            else:
                entries.append([rel, "other", oct(stat.S_IFMT(mode))])
    return sha256_json(entries)


def sha256_path(path: str | os.PathLike) -> str:
    """A file's or a directory tree's hash, whichever ``path`` is."""
    return sha256_tree(path) if os.path.isdir(path) else sha256_file(path)


def verify_recorded(
    what: str,
    path: str | os.PathLike,
    recorded: str,
    *,
    since: str = "it was recorded",
    missing_hint: str = "",
) -> None:
    """The one check of a recorded hash: a ConfigError names ``what``, the
    path and both hashes when the file or tree is missing or differs."""
    if not os.path.exists(path):
        raise ConfigError(f"{what} is missing: {path}{missing_hint}")
    actual = sha256_path(path)
    if actual != recorded:
        raise ConfigError(
            f"{what} changed since {since}: {path} (recorded {recorded}, now {actual})"
        )


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_json(value: Any) -> str:
    return sha256_bytes(canonical_json(value))
