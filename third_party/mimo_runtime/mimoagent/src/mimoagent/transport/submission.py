"""The agent's work as it leaves its container, and as it enters a fresh one.

The General service grades an opensource-code episode in a fresh container
of the task's pristine image, never in the one where the agent's code ran:
whatever the agent left outside its repository (files it owns elsewhere,
IPC objects, a filled disk, state no cleanup knows of) stays behind with
that container. Only its changes to the repository travel:

* ``collect`` (root, in the agent's container, every agent process killed):
  from the change record (``verifier_guard.Pristine.changes``: the tree
  walked against the setup snapshot) the regular files whose content or
  mode differ from the base, read without following a link, and the paths
  the agent removed or turned into something else;
* ``apply`` (root, in the fresh container, before its verifier runs): those
  files written over the pristine repository as the agent uid, and those
  paths removed.

What never travels: links (a link could point out of the repository),
devices, FIFOs, sockets, anything under a ``.git`` directory, bytecode
(trusted by mtime and size alone), a file over ``FILE_LIMIT``, files past
``COUNT_LIMIT`` or ``TOTAL_LIMIT``. The change record still lists all of
them for the service's screen; those left behind are named in ``skipped``.
Both ends check every path and bound (``check_path``), and the service
checks the submission again between them (environments/general/submission.py).
"""

from __future__ import annotations

import base64
import os
import shutil
import stat

#: bounds of what travels: one file, all files' bytes, the number of files
#: and of removals. Base64 in a WebSocket message of at most 16 MiB.
FILE_LIMIT = 1 << 20
TOTAL_LIMIT = 8 << 20
COUNT_LIMIT = 4000
DELETE_LIMIT = 20000
PATH_LIMIT = 4096
_BYTECODE = (".pyc", ".pyo")
#: modes a carried file may have: executable or not, nothing else
MODES = (0o644, 0o755)


def check_path(rel: object) -> str | None:
    """Why ``rel`` may not travel (None when it may): a relative, normal
    path under the repository, no ``.git`` component, no bytecode."""
    if not isinstance(rel, str) or not rel or len(rel) > PATH_LIMIT or "\0" in rel:
        return "not a path"
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "not a normal relative path"
    if ".git" in parts:
        return "under .git"
    if rel.endswith(_BYTECODE) or "__pycache__" in parts:
        return "bytecode"
    return None


def _read_regular(repo: str, rel: str, limit: int) -> tuple[bytes, int] | str:
    """(content, mode) of a regular file reached through real directories
    only, or why not."""
    parts = rel.split("/")
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return "not under real directories"
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            return f"unreadable: {exc.strerror}"
        with os.fdopen(leaf, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file"
            if st.st_size > limit:
                return "too large"
            data = handle.read(limit + 1)
        if len(data) > limit:
            return "too large"
        return data, (0o755 if st.st_mode & 0o111 else 0o644)
    finally:
        os.close(fd)


def collect(repo: str, record: dict) -> dict:
    """The submission of the repository at ``repo`` from its change record:
    ``{"files": [{"path", "mode", "data"}], "deleted": [...], "skipped":
    [{"path", "why"}]}`` (data base64), within the bounds above."""
    files: list[dict] = []
    deleted: list[str] = []
    skipped: list[dict] = []
    total = 0
    for item in record.get("changes", []):
        rel, kind, status = item.get("path"), item.get("kind"), item.get("status")
        why = check_path(rel)
        if status == "deleted" or (kind != "file" and status in ("modified", "type_changed")):
            # Gone, or no longer a regular file: the pristine one goes too.
            if why is None and len(deleted) < DELETE_LIMIT:
                deleted.append(rel)
            elif why is None:
                skipped.append({"path": rel, "why": "removals beyond the bound"})
            if status == "deleted":
                continue
        if kind != "file":
            skipped.append({"path": str(rel)[:PATH_LIMIT], "why": f"not a regular file ({kind})"})
            continue
        if why is not None:
            skipped.append({"path": str(rel)[:PATH_LIMIT], "why": why})
            continue
        if len(files) >= COUNT_LIMIT:
            skipped.append({"path": rel, "why": "files beyond the bound"})
            continue
        got = _read_regular(repo, rel, min(FILE_LIMIT, TOTAL_LIMIT - total))
        if got == "too large" and item.get("size", 0) <= FILE_LIMIT:
            got = "bytes beyond the bound"
        if isinstance(got, str):
            skipped.append({"path": rel, "why": got})
            continue
        data, mode = got
        total += len(data)
        files.append({"path": rel, "mode": mode, "data": base64.b64encode(data).decode()})
    return {"files": files, "deleted": deleted, "skipped": skipped}


def _decoded(submission: object) -> tuple[list[tuple[str, int, bytes]], list[str]]:
    """The submission's files and removals, every bound checked; ValueError otherwise."""
    if not isinstance(submission, dict):
        raise ValueError("the submission is not an object")
    files, deleted = submission.get("files"), submission.get("deleted")
    if not isinstance(files, list) or not isinstance(deleted, list):
        raise ValueError("the submission needs files and deleted lists")
    if len(files) > COUNT_LIMIT or len(deleted) > DELETE_LIMIT:
        raise ValueError("the submission has more entries than its bound")
    out, total = [], 0
    for entry in files:
        if not isinstance(entry, dict) or set(entry) != {"path", "mode", "data"}:
            raise ValueError("a file entry is not {path, mode, data}")
        why = check_path(entry["path"])
        if why is not None or entry["mode"] not in MODES or not isinstance(entry["data"], str):
            raise ValueError(f"file {str(entry['path'])[:200]!r}: {why or 'bad mode or data'}")
        data = base64.b64decode(entry["data"], validate=True)
        total += len(data)
        if len(data) > FILE_LIMIT or total > TOTAL_LIMIT:
            raise ValueError("the submission's files exceed their bound")
        out.append((entry["path"], entry["mode"], data))
    for rel in deleted:
        why = check_path(rel)
        if why is not None:
            raise ValueError(f"removal {str(rel)[:200]!r}: {why}")
    return out, list(deleted)


def _parent_fd(repo: str, rel: str, uid: int, create: bool) -> int | None:
    """An open descriptor of ``rel``'s directory, every component a real
    directory of the repository (with ``create``, anything else in the way
    is replaced by a new directory of ``uid``'s); None when absent."""
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    for part in rel.split("/")[:-1]:
        try:
            st = os.lstat(part, dir_fd=fd)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            if not create:
                os.close(fd)
                return None
            os.unlink(part, dir_fd=fd)
            st = None
        if st is None:
            if not create:
                os.close(fd)
                return None
            os.mkdir(part, 0o755, dir_fd=fd)
            os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
        nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def _remove_at(fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def apply(repo: str, submission: dict, uid: int) -> dict:
    """Write the submission over the pristine repository at ``repo``: its
    removals first, then each file (created afresh, the agent uid's, its
    mode). Raises ValueError on a submission out of bounds."""
    files, deleted = _decoded(submission)
    removed = 0
    for rel in deleted:
        fd = _parent_fd(repo, rel, uid, create=False)
        if fd is None:
            continue
        try:
            st = os.lstat(rel.rsplit("/", 1)[-1], dir_fd=fd)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(rel.rsplit("/", 1)[-1], dir_fd=fd)
                removed += 1
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    written = 0
    for rel, mode, data in files:
        fd = _parent_fd(repo, rel, uid, create=True)
        name = rel.rsplit("/", 1)[-1]
        try:
            _remove_at(fd, name)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                          dir_fd=fd)
            with os.fdopen(out, "wb") as handle:
                handle.write(data)
                os.fchown(handle.fileno(), uid, uid)
                os.fchmod(handle.fileno(), mode)
        finally:
            os.close(fd)
        written += 1
    return {"files": written, "bytes": sum(len(d) for _, _, d in files), "removed": removed}
