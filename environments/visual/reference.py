"""Visual's reference solutions: what ``camg_client --policy oracle`` plays.

Webdev rows carry no solution; a task has one only when preparation was
given its reference site (``camg.prepare --environment visual --references
DIR``, DIR/<task_id>/ holding the site, index.html at its top — the demo
builder's ``reference/``). The prepared task data then holds ``reference``:
``{"files": {relative path: base64 bytes}}``. It is played as shell actions
that append a base64 tar.gz of the site to a file in the workspace in chunks
(a command holds at most ``max_command_chars``), unpack it into dist/, then
``finish`` (render and judge).

The site lives in the service's manifest only, never in the task image; the
service hands it out only where the deployment enables ``references``.
"""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from camg.errors import DatasetError, NotFound
from camg.sandboxes.shell_reference import shipped

MAX_SITE_BYTES = 8 << 20


def plan(task_id: str, data: Mapping[str, Any], *, cwd: str, max_command_chars: int) -> list[dict]:
    """Every action of the task's reference solution, in order."""
    reference = data.get("reference")
    if not isinstance(reference, Mapping) or not isinstance(reference.get("files"), Mapping):
        raise NotFound(
            f"visual task {task_id!r} was prepared without a reference site "
            "(camg.prepare --environment visual --references DIR)"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, encoded in sorted(reference["files"].items()):
            body = base64.b64decode(encoded)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(body), 0o644, 0
            tar.addfile(info, io.BytesIO(body))
    store = f"{cwd.rstrip('/')}/.camg-reference.b64"
    return shipped(
        buf.getvalue(),
        store,
        f"mkdir -p dist && base64 -d {store} | tar -xz -C dist && rm -f {store}",
        max_command=max_command_chars,
    )


def load(directory: str | Path, task_id: str) -> dict | None:
    """``directory``/<task_id>/ as a reference (None if absent): every regular
    file under it by its relative path; index.html must be one of them."""
    site = Path(directory) / task_id
    if not site.is_dir():
        return None
    files, total = {}, 0
    for path in sorted(site.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise DatasetError(f"{path}: a reference site holds regular files and directories only")
        if path.is_file():
            body = path.read_bytes()
            total += len(body)
            files[path.relative_to(site).as_posix()] = base64.b64encode(body).decode()
    if "index.html" not in files or total > MAX_SITE_BYTES:
        raise DatasetError(
            f"{site}: a reference site needs index.html and at most {MAX_SITE_BYTES} bytes"
        )
    return {"files": files}
