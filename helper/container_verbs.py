"""The container verbs' handlers, registered in helper/verbs.py's table.

Each handler checks its parameters (helper/containers.py, helper/commands.py)
before Docker is called; each acts only on the calling peer's containers.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time

from camg import helper_wire as wire
from camg.helper_wire import FdBlob, WireError
from helper import commands, usage
from helper import containers as mc
from helper.container_ops import mapped, pid_exited

log = logging.getLogger("camg.helper")
# This helper process's id, in Ping's and ContainerCreate's replies. A
# container outlives its helper's death in dockerd (a sandbox does not), and
# the next helper's start-up sweep removes it: a client holding containers
# made under another instance knows they are gone (camg/sandboxes/containers.py
# ContainerPool drops them instead of handing them out).
INSTANCE = secrets.token_hex(8)


def _m(ctx) -> mc.Mediator:
    return mc.mediator(ctx.registry.config)


def _path(path: str, what: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 4096:
        raise WireError("bad_request", f"{what}: an absolute path without NUL")
    return os.path.normpath(path)


def start_status(ctx) -> dict[str, int]:
    """For Ping: container creates/starts in flight and waiting for a slot
    (helper/container_gate.py), without making the mediator."""
    return mc.start_status(ctx.registry.config)


def container_pull(ctx, peer, p: wire.ContainerPullParams, blob: bytes):
    m = _m(ctx)
    image = m.check_image(p.image)
    return {"image": image, "image_id": m.docker.pull(image)}, b""


def container_create(ctx, peer, p: wire.ContainerCreateParams, blob: bytes):
    held = _m(ctx).create(peer, p)
    return {
        "container_id": held.id,
        "image": held.image,
        "episode_id": held.episode_id,
        "pool": held.pool,
        "instance": INSTANCE,
    }, b""


def container_connect(ctx, peer, p: wire.ContainerConnectParams, blob: bytes):
    m = _m(ctx)
    sock = m.connect(m.get(peer, p.container_id), p.port, p.timeout)
    return {"port": p.port}, FdBlob.carrying(sock.detach())


def container_exec(ctx, peer, p: wire.ContainerExecParams, blob: bytes):
    m = _m(ctx)
    commands.check_exec(p.command, p, m.ceilings)
    cwd = _path(p.cwd, "cwd")
    held = m.get(peer, p.container_id)
    user = m.agent if p.user == "agent" else "0:0"
    env = {"PATH": commands.PATH, **p.env}
    code, out, total, timed_out, duration = m.docker.exec(
        held.id,
        cmd=["/bin/sh", "-c", p.command],
        user=user,
        workdir=cwd,
        env=env,
        stdin=blob,
        timeout=p.timeout,
        limit=p.output_limit,
    )
    return commands.exec_reply(code, out, total, timed_out, duration, p.output_limit), b""


def container_put_archive(ctx, peer, p: wire.ContainerPutArchiveParams, blob: bytes):
    m = _m(ctx)
    dest = _path(p.dest_dir, "dest_dir")
    # dockerd extracts inside the container's root (chrooted): no member or
    # symlink of the stream reaches the host.
    m.docker.put_archive(m.get(peer, p.container_id).id, dest, blob)
    return {"bytes": len(blob)}, b""


def container_get_archive(ctx, peer, p: wire.ContainerGetArchiveParams, blob: bytes):
    m = _m(ctx)
    path = _path(p.path, "path")
    data = m.docker.get_archive(m.get(peer, p.container_id).id, path, m.ceilings.archive_bytes)
    return {"bytes": len(data)}, data


def container_logs(ctx, peer, p: wire.ContainerLogsParams, blob: bytes):
    m = _m(ctx)
    if not 0 <= p.tail_bytes <= m.ceilings.output_bytes:
        raise WireError(
            "limit_exceeded", f"tail_bytes: must be within [0, {m.ceilings.output_bytes}]"
        )
    data = m.docker.logs(m.get(peer, p.container_id).id, p.tail_bytes)
    return {"logs": data.decode("utf-8", "replace")}, b""


def container_usage(ctx, peer, p: wire.ContainerParams, blob: bytes):
    m = _m(ctx)
    held = m.get(peer, p.container_id)
    with mapped(f"usage of {held.id[:12]}"):
        return usage.container_usage(m.docker.api, held.id), b""


#: rounds before a container whose agent processes survive is given up on,
#: and how long one round waits for the killed to be gone
REAP_ROUNDS = 5
_REAP_WAIT_S = 2.0


def container_reap(ctx, peer, p: wire.ContainerParams, blob: bytes):
    """Kill every process of the agent uid in the container, from outside.

    Before a grade collects anything, nothing the agent started may still
    run: a detached process that fills the container's pids limit made the
    transport's own kill (a fork inside the container) fail with EAGAIN and
    the episode end null. The helper forks nothing there: it freezes the
    container (docker pause: the freezer cgroup, so nothing forks between
    the listing and the kill), sends SIGKILL to each agent process from the
    host, and thaws it (a killed process never returns to user space, so
    none forks again). The transport (root) is left running. A freeze can
    fail on a loaded host (runc's "unable to freeze" while a task sleeps
    uninterruptibly); then each round stops every agent process it sees
    with SIGSTOP until a listing finds none running (a stopped process
    cannot fork) and kills them all."""
    m = _m(ctx)
    held = m.get(peer, p.container_id)
    uid = int(m.agent.split(":")[0])
    started = time.monotonic()
    killed, frozen = 0, True
    for _ in range(REAP_ROUNDS):
        if pid_exited(held.pidfd):
            raise WireError("sandbox_died", f"container {held.id[:12]} is not running")
        if frozen:
            try:
                m.docker.pause(held.id)
            except WireError as exc:
                log.warning(
                    "reap of %s: freezing failed, stopping its processes instead: %s",
                    held.id[:12],
                    exc.message,
                )
                frozen = False
        try:
            found = _kill_agent(held.pidfd, uid, stop_first=not frozen)
        finally:
            if frozen:
                m.docker.unpause(held.id)
        killed += len(found)
        end = time.monotonic() + _REAP_WAIT_S
        while found and time.monotonic() < end:
            time.sleep(0.01)
            found = _agent_processes(held.pidfd, uid)
        if not found:
            return {
                "killed": killed,
                "frozen": frozen,
                "duration": round(time.monotonic() - started, 4),
            }, b""
    raise WireError(
        "internal",
        f"{len(found)} agent process(es) of container {held.id[:12]} "
        f"survive SIGKILL after {REAP_ROUNDS} rounds",
    )


def _agent_processes(pidfd: int, uid: int) -> list[int]:
    from helper.container_fork import agent_processes

    return agent_processes(pidfd, uid)


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _kill_agent(pidfd: int, uid: int, *, stop_first: bool) -> list[int]:
    """SIGKILL every agent process; unfrozen, SIGSTOP them first, listing
    again until no new one appears (bounded: what a later round finds, it
    kills)."""
    found = _agent_processes(pidfd, uid)
    if stop_first:
        seen: set[int] = set()
        for _ in range(50):
            new = [pid for pid in found if pid not in seen]
            if not new:
                break
            _signal(new, signal.SIGSTOP)
            seen.update(new)
            found = _agent_processes(pidfd, uid)
        found = sorted(seen.union(found))
    _signal(found, signal.SIGKILL)
    return found


def container_fork(ctx, peer, p: wire.ContainerForkParams, blob: bytes):
    from helper import container_fork

    m = _m(ctx)
    held, timings = container_fork.fork(m, peer, p)
    return {
        "container_id": held.id,
        "image": held.image,
        "episode_id": held.episode_id,
        "pool": False,
        "instance": INSTANCE,
        "snapshot": held.snapshot,
        "depth": held.depth,
        **timings,
    }, b""


def container_remove(ctx, peer, p: wire.ContainerParams, blob: bytes):
    m = _m(ctx)
    try:
        held = m.get(peer, p.container_id)
    except WireError as exc:
        if exc.name == "not_found":
            return {"removed": False}, b""  # idempotent: already gone
        raise
    return {"removed": m.remove(held)}, b""


def container_list(ctx, peer, p: wire.NoParams, blob: bytes):
    m = _m(ctx)
    found = m.docker.list_labelled(
        {"camg.helper": m.cfg.scope, "camg.service": peer.owner, "camg.uid": str(peer.uid)}
    )
    found = [
        c for c in found if not m.standby.unclaimed(c)
    ]  # not the peer's until a fork takes one
    out = [
        {
            "container_id": c["Id"],
            "image": c["Image"],
            "episode_id": c["Labels"].get("camg.episode", ""),
            "pool": c["Labels"].get("camg.pool") == "1",
            "state": c["State"],
            "created_at": c["Created"],
        }
        for c in found
    ]
    return {"containers": out}, b""


def container_release_all(ctx, peer, p: wire.NoParams, blob: bytes):
    return {"released": _m(ctx).release_all(peer)}, b""


def release_for(ctx, peer) -> int:
    """For the ReleaseAll verb: this peer's containers too, when the helper has any."""
    if ctx.registry.config.containers is None:
        return 0
    try:
        return _m(ctx).release_all(peer)
    except WireError as exc:
        log.warning(
            "releasing containers of %s failed, left for the sweep: %s", peer.owner, exc.message
        )
        return 0
