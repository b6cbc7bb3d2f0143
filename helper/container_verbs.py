"""The container verbs' handlers, registered in helper/verbs.py's table.

Each handler checks its parameters (helper/containers.py) before Docker is
called; each acts only on the calling peer's containers.
"""

from __future__ import annotations

import logging
import os
import secrets

from camg.helper_wire import TIMEOUT_MARKER, TRUNCATION_MARKER, FdBlob, WireError
from helper import containers as mc

log = logging.getLogger("camg.helper")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# This helper process's id, in Ping's and ContainerCreate's replies. A
# container outlives its helper's death in dockerd (a sandbox does not), and
# the next helper's start-up sweep removes it: a client holding containers
# made under another instance knows they are gone (camg/containers.py
# ContainerPool drops them instead of handing them out).
INSTANCE = secrets.token_hex(8)


def _m(ctx) -> mc.Mediator:
    return mc.mediator(ctx.registry.config)


def _path(path: str, what: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 4096:
        raise WireError("bad_request", f"{what}: an absolute path without NUL")
    return os.path.normpath(path)


def pull(ctx, peer, p: mc.PullParams, blob: bytes):
    m = _m(ctx)
    image = m.check_image(p.image)
    return {"image": image, "image_id": m.docker.pull(image)}, b""


def create(ctx, peer, p: mc.CreateParams, blob: bytes):
    held = _m(ctx).create(peer, p)
    return {"container_id": held.id, "image": held.image, "episode_id": held.episode_id,
            "pool": held.pool, "instance": INSTANCE}, b""


def connect(ctx, peer, p: mc.ConnectParams, blob: bytes):
    m = _m(ctx)
    sock = m.connect(m.get(peer, p.container_id), p.port, p.timeout)
    return {"port": p.port}, FdBlob.carrying(sock.detach())


def exec_(ctx, peer, p: mc.ExecParams, blob: bytes):
    m = _m(ctx)
    if "\0" in p.command or len(p.command.encode()) > m.command_bytes:
        raise WireError("limit_exceeded", f"command: at most {m.command_bytes} bytes without NUL")
    if not 0 < p.timeout <= m.timeout:
        raise WireError("limit_exceeded", f"timeout: must be within (0, {m.timeout}]")
    if not 1 <= p.output_limit <= m.output_bytes:
        raise WireError("limit_exceeded", f"output_limit: must be within [1, {m.output_bytes}]")
    cwd = _path(p.cwd, "cwd")
    mc.check_env(p.env)
    held = m.get(peer, p.container_id)
    user = m.agent if p.user == "agent" else "0:0"
    env = {"PATH": PATH, **p.env}
    code, out, total, timed_out, duration = m.docker.exec(
        held.id, cmd=["/bin/sh", "-c", p.command], user=user, workdir=cwd, env=env, stdin=blob,
        timeout=p.timeout, limit=p.output_limit)
    text = out.decode("utf-8", "replace")
    truncated = total > p.output_limit
    if truncated:
        text = TRUNCATION_MARKER.format(limit=p.output_limit) + text
    if timed_out:
        text += TIMEOUT_MARKER
    return {"exit_code": code, "output": text, "truncated": truncated, "timed_out": timed_out,
            "duration": round(duration, 6)}, b""


def put_archive(ctx, peer, p: mc.PutArchiveParams, blob: bytes):
    m = _m(ctx)
    dest = _path(p.dest_dir, "dest_dir")
    # dockerd extracts inside the container's root (chrooted): no member or
    # symlink of the stream reaches the host.
    m.docker.put_archive(m.get(peer, p.container_id).id, dest, blob)
    return {"bytes": len(blob)}, b""


def get_archive(ctx, peer, p: mc.GetArchiveParams, blob: bytes):
    m = _m(ctx)
    path = _path(p.path, "path")
    data = m.docker.get_archive(m.get(peer, p.container_id).id, path, m.archive_bytes)
    return {"bytes": len(data)}, data


def logs(ctx, peer, p: mc.LogsParams, blob: bytes):
    m = _m(ctx)
    if not 0 <= p.tail_bytes <= m.output_bytes:
        raise WireError("limit_exceeded", f"tail_bytes: must be within [0, {m.output_bytes}]")
    data = m.docker.logs(m.get(peer, p.container_id).id, p.tail_bytes)
    return {"logs": data.decode("utf-8", "replace")}, b""


def remove(ctx, peer, p: mc.ContainerParams, blob: bytes):
    m = _m(ctx)
    try:
        held = m.get(peer, p.container_id)
    except WireError as exc:
        if exc.name == "not_found":
            return {"removed": False}, b""  # idempotent: already gone
        raise
    return {"removed": m.remove(held)}, b""


def list_(ctx, peer, p, blob: bytes):
    m = _m(ctx)
    found = m.docker.list_labelled({"camg.helper": m.cfg.scope, "camg.service": peer.owner,
                                    "camg.uid": str(peer.uid)})
    out = [{"container_id": c["Id"], "image": c["Image"],
            "episode_id": c["Labels"].get("camg.episode", ""), "pool": c["Labels"].get("camg.pool") == "1",
            "state": c["State"], "created_at": c["Created"]} for c in found]
    return {"containers": out}, b""


def release_all(ctx, peer, p, blob: bytes):
    return {"released": _m(ctx).release_all(peer)}, b""


def release_for(ctx, peer) -> int:
    """For the ReleaseAll verb: this peer's containers too, when the helper has any."""
    if ctx.registry.config.containers is None:
        return 0
    try:
        return _m(ctx).release_all(peer)
    except WireError as exc:
        log.warning("releasing containers of %s failed, left for the sweep: %s", peer.owner, exc.message)
        return 0


# name, params, handler, doc, blob_in, blob_out (helper/verbs.py builds Verbs).
TABLE = (
    ("ContainerPull", mc.PullParams, pull, "Pull a manifest image by digest -> image_id.", "", ""),
    ("ContainerCreate", mc.CreateParams, create, "Create and start a container (init, no network, "
     "bounded) -> container_id.", "", ""),
    ("ContainerConnect", mc.ConnectParams, connect, "A TCP socket connected to 127.0.0.1:port inside "
     "the container, passed as a file descriptor (SCM_RIGHTS).", "", "fd"),
    ("ContainerExec", mc.ExecParams, exec_, "Run a sh command -> exit_code, output, truncated, timed_out, "
     "duration.", "stdin", ""),
    ("ContainerPutArchive", mc.PutArchiveParams, put_archive, "Extract a tar stream into an existing "
     "dest_dir.", "tar", ""),
    ("ContainerGetArchive", mc.GetArchiveParams, get_archive, "A tar stream of path.", "", "tar"),
    ("ContainerLogs", mc.LogsParams, logs, "The final tail_bytes of the container's output.", "", ""),
    ("ContainerRemove", mc.ContainerParams, remove, "Kill and remove (idempotent).", "", ""),
    ("ContainerList", "NoParams", list_, "The caller's containers.", "", ""),
    ("ContainerReleaseAll", "NoParams", release_all, "Remove every container of the caller.", "", ""),
)
