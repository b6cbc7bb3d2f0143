"""The agent's changes between its container and the fresh one that grades them.

An opensource-code episode is graded in a fresh container of the task's
pristine image, never in the one where the agent's code ran (README,
"Grade integrity (opensource-code)"). The agent's transport hands over a
submission (mimoagent.transport.submission.collect: the changed regular
files of the repository, base64, and the paths removed); this module checks
it again on the service's side of both containers before it goes on, so a
transport that misbehaves cannot carry anything else across: each path a
normal relative path in the repository, no ``.git`` component, no
bytecode, each file at most ``FILE_LIMIT`` bytes with mode 0644 or 0755,
at most ``COUNT_LIMIT`` files and ``TOTAL_LIMIT`` bytes in all, no path
twice. What fails is the transport's fault, never the agent's (it names no
paths of its own choosing that pass), so it is a GraderError.
"""

from __future__ import annotations

import base64
import binascii

from camg import errors

#: the transport's bounds (mimoagent.transport.submission; a unit test holds them equal)
FILE_LIMIT = 1 << 20
TOTAL_LIMIT = 8 << 20
COUNT_LIMIT = 4000
DELETE_LIMIT = 20000
PATH_LIMIT = 4096
MODES = (0o644, 0o755)
_BYTECODE = (".pyc", ".pyo")
#: skipped paths kept in the outcome record
SKIPPED_SHOWN = 50


def path_problem(rel: object) -> str | None:
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


def checked(submission: object) -> dict:
    """``{"files", "deleted"}`` of a well-formed submission within its
    bounds (what the fresh container is given); GraderError otherwise."""

    def refuse(why: str) -> errors.GraderError:
        return errors.GraderError(f"the agent's transport handed over a bad submission: {why}")

    if not isinstance(submission, dict) or not set(submission) <= {"files", "deleted", "skipped"}:
        raise refuse("not an object of files, deleted and skipped")
    files, deleted = submission.get("files"), submission.get("deleted")
    if not isinstance(files, list) or not isinstance(deleted, list):
        raise refuse("files and deleted must be lists")
    if len(files) > COUNT_LIMIT or len(deleted) > DELETE_LIMIT:
        raise refuse("more entries than the bound")
    seen: set[str] = set()
    total = 0
    for entry in files:
        if not isinstance(entry, dict) or set(entry) != {"path", "mode", "data"}:
            raise refuse("a file entry is not {path, mode, data}")
        rel = entry["path"]
        problem = path_problem(rel) or (None if entry["mode"] in MODES else "mode")
        if problem is None and rel in seen:
            problem = "named twice"
        if problem is not None or not isinstance(entry["data"], str):
            raise refuse(f"{str(rel)[:200]!r}: {problem or 'data'}")
        seen.add(rel)
        try:
            size = len(base64.b64decode(entry["data"], validate=True))
        except (binascii.Error, ValueError):
            raise refuse(f"{rel[:200]!r}: data is not base64") from None
        total += size
        if size > FILE_LIMIT or total > TOTAL_LIMIT:
            raise refuse("files beyond the bound")
    for rel in deleted:
        problem = path_problem(rel)
        if problem is not None:
            raise refuse(f"removal {str(rel)[:200]!r}: {problem}")
    return {"files": [dict(e) for e in files], "deleted": list(deleted)}


def stats(submission: dict) -> dict:
    """What the outcome record says of a submission: counts, and the first
    paths left behind with why (links, bytecode, beyond a bound)."""
    files = submission.get("files") or []
    skipped = [s for s in submission.get("skipped") or [] if isinstance(s, dict)]
    return {
        "files": len(files),
        "bytes": sum(len(base64.b64decode(f["data"])) for f in files),
        "deleted": len(submission.get("deleted") or []),
        "skipped": len(skipped),
        "skipped_paths": [
            {"path": str(s.get("path"))[:300], "why": str(s.get("why"))[:100]}
            for s in skipped[:SKIPPED_SHOWN]
        ],
    }
