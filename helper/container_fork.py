"""Forking a container (ContainerFork): a new container of the caller's with
the parent's filesystem as it stands.

On overlay2 (this host's storage driver) the child is a container of the
parent's manifest image, created with the parent's checked ContainerCreate
parameters -- resources, user, command, environment, the one read-only
mount, no network, no privilege -- and its writable layer bounded like any
container's, but not started: a standby made in the background after an
earlier fork of the same spec (helper/container_standby.py), else one made
now. The parent is paused (freezer cgroup, as docker commit pauses) while
its upper is copied into the child's (container_disk.copy_upper), then
resumed while the child starts. No image is made: a child of a child
copies that child's upper, which holds everything since the manifest
image, so nothing stacks however deep the chain (the depth is still
bounded, by name: each level is one more full copy).

On another storage driver (no upper directory to copy) the parent is
committed (Docker pauses it meanwhile) into a local image labelled
camg.helper=<scope>, camg.fork=1 and the parent's owner, reached only by its
content-addressed id, and the child runs that. A snapshot image goes when
its last container does (``release``, after every removal of a fork's
child; ``collect`` after a release of a peer's containers), and the
helper's sweep removes any that a crash left (container_ops.sweep_scope).

What neither carries is processes: the child starts its command afresh. An
agent-uid process still running in the parent (a background job) is refused
by name before anything is copied, unless the caller allows it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

from camg.helper_wire import ContainerForkParams, WireError
from helper import container_disk
from helper import container_ops as ops

log = logging.getLogger("camg.helper")
# A committed snapshot of a snapshot stacks one more image layer (overlay2
# mounts at most ~125 lowers), and a copied fork copies all its parent
# wrote: a bound on chains, by name.
MAX_FORK_DEPTH = 32


def fork(m, peer, p: ContainerForkParams):
    """(child Held, timings). Ceilings and the parent's state are checked before any work."""
    parent = m.get(peer, p.container_id)  # another peer's container is not found
    if parent.params is None:
        raise WireError("internal", f"container {parent.id[:12]} has no recorded parameters")
    if parent.depth + 1 > MAX_FORK_DEPTH:
        raise WireError("limit_exceeded", f"fork depth: at most {MAX_FORK_DEPTH} forks of forks")
    child_params = dataclasses.replace(
        parent.params, episode_id=p.episode_id, pool=False, labels={}
    )
    # The manifest as it is now: an image dropped from it is not run again, forked or not.
    m.check_image(child_params.image)
    labels = m.check_create(peer, child_params)
    with m.lock:
        m.admit(peer)  # at_capacity before any work, not after
    if ops.pid_exited(parent.pidfd):
        raise WireError("sandbox_died", f"container {parent.id[:12]} is not running")
    if not p.allow_agent_processes:
        found = agent_processes(parent.pidfd, int(m.agent.split(":")[0]))
        if found:
            raise WireError(
                "not_allowed",
                f"{len(found)} agent process(es) still run in container "
                f"{parent.id[:12]} (processes cannot be forked)",
            )
    parent_layer = m.docker.layer(parent.id)
    if parent_layer is None:
        return _fork_by_commit(m, peer, parent, child_params, labels)
    try:
        return _fork_by_copy(m, peer, parent, parent_layer, child_params, labels)
    finally:
        m.standby.refill(peer, child_params)


def _fork_by_copy(m, peer, parent, parent_layer: str, child_params, labels: dict):
    timings: dict[str, float | bool] = {}

    def launch(name: str) -> tuple[str, int]:
        t0 = time.monotonic()
        made = m.standby.take(peer, child_params)
        timings["standby"] = made is not None
        if made is None:
            made = m.docker.create(
                name=name,
                image=child_params.image,
                labels={**labels, "camg.fork": "1"},
                **m.run_spec(child_params),
            )
        cid, layer = made
        try:
            if layer is None:
                raise WireError(
                    "internal", f"container {cid[:12]} has no overlay2 layer to copy into"
                )
            t1 = time.monotonic()
            m.docker.pause(parent.id)
            try:
                container_disk.copy_upper(parent_layer, layer)
            except BaseException:
                m.docker.unpause(parent.id)
                raise
            t2 = time.monotonic()
            # The parent resumes while the child starts.
            resumed: dict = {}
            thread = threading.Thread(
                target=_unpause, args=(m, parent.id, resumed), name="fork-unpause"
            )
            thread.start()
        except BaseException:
            m.docker.remove(cid)
            raise
        try:
            pid = m.docker.start(cid)  # (removes the child if it does not run)
        finally:
            thread.join()
            if "error" in resumed:
                log.error(
                    "container %s stays paused after a fork: %s", parent.id[:12], resumed["error"]
                )
        t3 = time.monotonic()
        timings.update(
            create_s=round(t1 - t0, 4), copy_s=round(t2 - t1, 4), start_s=round(t3 - t2, 4)
        )
        return cid, pid

    child = m.start(peer, child_params, labels, depth=parent.depth + 1, launch=launch)
    return child, timings


def _unpause(m, cid: str, out: dict) -> None:
    try:
        m.docker.unpause(cid)
    except BaseException as exc:  # handed to the forking thread
        out["error"] = exc


def _fork_by_commit(m, peer, parent, child_params, labels: dict):
    started = time.monotonic()
    image_labels = {
        "camg.helper": m.cfg.scope,
        "camg.boot": m.boot,
        "camg.fork": "1",
        "camg.service": peer.owner,
        "camg.uid": str(peer.uid),
        "camg.parent": parent.id[:12],
    }
    snapshot = m.docker.commit(parent.id, image_labels)
    committed = time.monotonic()
    with m.lock:
        # A snapshot of a fork's child stacks on that child's snapshot:
        # Docker keeps the older image while the newer one exists.
        m.lineage[snapshot] = parent.snapshot
    try:
        child = m.start(
            peer,
            child_params,
            labels,
            run_image=snapshot,
            snapshot=snapshot,
            depth=parent.depth + 1,
        )
    except BaseException:
        release(m, snapshot)
        raise
    return child, {
        "commit_s": round(committed - started, 4),
        "create_s": round(time.monotonic() - committed, 4),
    }


def release(m, snapshot: str) -> None:
    """After a container running ``snapshot`` went: remove that image, and
    the older snapshots it stacked on, as far as nothing else uses them
    (Docker answers 409 for an image a container or a newer image holds)."""
    try:
        while snapshot:
            if m.docker.remove_image(snapshot) is None:
                return  # still in use: its last user's removal comes back here
            with m.lock:
                snapshot = m.lineage.pop(snapshot, "")
    except WireError as exc:  # the next release or the sweep takes it
        log.warning("removing snapshot image %s failed: %s", snapshot[:19], exc.message)


def collect(m) -> int:
    """Remove this helper instance's snapshot images that no container uses
    (a release of every container of a peer: one pass over all of them)."""
    try:
        return m.docker.remove_images_labelled(
            {"camg.helper": m.cfg.scope, "camg.boot": m.boot, "camg.fork": "1"}
        )
    except WireError as exc:  # the next removal or the sweep tries again
        log.warning("removing snapshot images failed: %s", exc.message)
        return 0


def _pid_of(pidfd: int) -> int:
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise WireError("internal", "no pid behind the container's pidfd")


def agent_processes(pidfd: int, agent_uid: int, proc: str = "/proc") -> list[int]:
    """Live processes with the agent uid in the container's pid namespace,
    but its main process (the command, the init's first child)."""
    init = _pid_of(pidfd)
    if init <= 0:
        return []
    try:
        ns = os.readlink(f"{proc}/{init}/ns/pid")
    except OSError:
        return []
    members: list[tuple[int, int, int, bool]] = []  # pid, ppid, start, agent's
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"{proc}/{name}/ns/pid") != ns:
                continue
            with open(f"{proc}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"{proc}/{name}/status", encoding="ascii", errors="replace") as f:
                uids = next((line.split()[1:] for line in f if line.startswith("Uid:")), [])
        except (OSError, IndexError, StopIteration):
            continue  # gone meanwhile
        if fields[0] == b"Z":
            continue
        members.append((int(name), int(fields[1]), int(fields[19]), str(agent_uid) in uids))
    children = sorted((start, pid) for pid, ppid, start, _ in members if ppid == init)
    main = children[0][1] if children else -1
    return [pid for pid, _, _, agent in members if agent and pid not in (init, main)]
