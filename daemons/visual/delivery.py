"""What of a delivered dist/ reaches the renderer, and the integrity verdict.

Docker's archive of /workspace/dist holds whatever the agent left there. The
renderer gets regular files and directories only, named relative to dist/.
Links are resolved *inside the archive* (never on any filesystem): a hard
link or a relative symlink whose target is a regular file of the same dist/
is delivered as a copy of it, as upstream's HTTP server would serve it; any
other link and every fifo or device is dropped and named in the evidence.

The verdict (``integrity`` in the outcome record):

* ``tampered`` (reward 0.0, no judge call): the delivery reaches outside
  dist/ -- a symlink whose target is absolute or climbs out of dist/
  (``symlink_out_of_dist``), or a page that tried to load a ``file:`` URL
  (``file_url_load``). The delivery contract says everything lives in dist/
  with relative paths; neither has an honest reading there, and each aims at
  files the renderer must never show (the reference site, host or judge
  files).
* ``ok``, with evidence: links dropped inside dist/ (``link_dropped``),
  fifos and devices (``special_file``), WebSocket attempts beyond the page's
  origin (``websocket``), external assets (``external_load``; the episode is
  ``render_error`` anyway). They cannot put anything in the screenshot and
  can be honest slips.
"""

from __future__ import annotations

import io
import posixpath
import tarfile

from camg import errors

TAMPERING = ("symlink_out_of_dist", "file_url_load")
MAX_LINK_HOPS = 8
MAX_EVIDENCE = 20


def _rel(name: str) -> str | None:
    """A member's path relative to dist/ (Docker names them ``dist/...``)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) < 2 or ".." in parts:
        return None
    return "/".join(parts[1:])


def _target(rel: str, link: str) -> str | None:
    """A symlink's target relative to dist/, None when it leaves dist/."""
    if link.startswith("/"):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), link))
    return None if joined == ".." or joined.startswith("../") else joined


def strip_top(tar: bytes, limit: int = 48 << 20) -> tuple[bytes, list[str]]:
    """(the renderer's tar of dist/, evidence lines); RenderError when the
    files, link copies included, exceed ``limit`` bytes."""
    out, evidence = io.BytesIO(), []

    def note(line: str) -> None:
        if len(evidence) < MAX_EVIDENCE:
            evidence.append(line)

    with tarfile.open(fileobj=out, mode="w") as dst:
        if tar:  # no dist/ at all renders as a missing index.html
            _add_members(dst, tar, note, [limit])
    return out.getvalue(), evidence


def _add_members(dst: tarfile.TarFile, tar: bytes, note, budget: list[int]) -> None:
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:*") as src:
        members = src.getmembers()
        by_rel = {r: m for m in members if (r := _rel(m.name)) is not None}
        for rel, member in by_rel.items():
            if member.isdir():
                info = tarfile.TarInfo(rel)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                dst.addfile(info)
            elif member.isfile():
                _copy(dst, rel, src.extractfile(member), budget)
            elif member.issym():
                found, escaped = _resolve(rel, member, by_rel)
                if escaped:
                    note(f"symlink_out_of_dist: dist/{rel} -> {member.linkname[:200]}")
                elif found is None:
                    note(f"link_dropped: dist/{rel} -> {member.linkname[:200]}")
                else:
                    _copy(dst, rel, src.extractfile(found), budget)
            elif member.islnk():
                target = by_rel.get(_rel(member.linkname) or "")
                if target is not None and target.isfile():
                    _copy(dst, rel, src.extractfile(target), budget)
                else:
                    note(f"link_dropped: dist/{rel} (hard link to {member.linkname[:200]})")
            else:
                note(f"special_file: dist/{rel} ({_kind(member)})")


def _resolve(rel: str, member: tarfile.TarInfo, by_rel: dict
             ) -> tuple[tarfile.TarInfo | None, bool]:
    """(the regular file of the archive a symlink chain ends at or None,
    whether some hop of it leaves dist/)."""
    for _ in range(MAX_LINK_HOPS):
        target = _target(rel, member.linkname)
        if target is None:
            return None, True
        member, rel = by_rel.get(target), target
        if member is None or member.isfile():
            return member, False
        if not member.issym():
            return None, False
    return None, False


def _copy(dst: tarfile.TarFile, rel: str, handle, budget: list[int]) -> None:
    data = handle.read() if handle else b""
    budget[0] -= len(data)
    if budget[0] < 0:
        raise errors.RenderError("dist/ (link copies included) is larger than its limit",
                                 reason="dist_too_large")
    info = tarfile.TarInfo(rel)
    info.size, info.mode = len(data), 0o644
    dst.addfile(info, io.BytesIO(data))


def _kind(member: tarfile.TarInfo) -> str:
    return {tarfile.FIFOTYPE: "fifo", tarfile.CHRTYPE: "character device",
            tarfile.BLKTYPE: "block device"}.get(member.type, f"type {member.type!r}")


def render_evidence(local_loads, sockets, blocked=()) -> list[str]:
    """Evidence lines from what the page tried while it was rendered."""
    lines = [f"file_url_load: {url[:200]}" for url in local_loads[:MAX_EVIDENCE]]
    lines += [f"websocket: {url[:200]}" for url in sockets[:MAX_EVIDENCE]]
    lines += [f"external_load: {url[:200]}" for url in list(blocked)[:MAX_EVIDENCE]]
    return lines


def verdict(evidence: list[str]) -> dict:
    """The outcome record's part."""
    tampered = any(line.split(":", 1)[0] in TAMPERING for line in evidence)
    body: dict = {"integrity": "tampered" if tampered else "ok"}
    if evidence:
        body["integrity_evidence"] = list(evidence)
    return body
