"""ForkSandbox: a second sandbox continuing from one's filesystem as it stands.

The parent's upper becomes a read-only layer shared by parent and child, and
each gets a fresh, empty upper over it, so a fork costs the same whatever
the agent wrote:

1. refusals first (peer, capacity): nothing exists yet;
2. the parent's init hands over a read-only clone of the mount holding its
   upper (sbxinit's fd 4: the scratch tmpfs, or the disk upper's ext4);
3. the parent's init is killed (its overlay, the only writer of that upper,
   goes with its mount namespace) and a new one is started over
   lowers + layers + the frozen upper, with a fresh upper; then the child's,
   the same stack, in cgroups of its own.

A parent whose upper is empty (nothing written since it was made or last
forked) is not frozen again: the child gets a fresh upper over the parent's
exact stack and the parent is left as it runs (_fork_over_stack), so a
group of forks of one prefix, or a chain of forks that write nothing, adds
no depth.

Processes are not carried: a fork copies the filesystem, and a parent that
still runs anything besides init (a daemon the agent left) is refused
(not_allowed) rather than have it killed. Both sides continue with a fresh
init; neither sees the other's later writes.

Layers are kernel objects held only by descriptors (here, and inside the
overlays of the sandboxes stacking them): the last user's destroy closes
the helper's, and a helper that dies takes every one with it (the inits exit
with it), so the sweep has nothing of theirs to find beyond what the ledger
already names: a disk layer lives in its parent's upper filesystem, whose
directory and image the parent's record names; it is unmounted lazily at
the parent's destroy and freed by the kernel with the last reference.

Bounds: a fork may not give either side more room than the parent had: the
new uppers are sized to the parent's free space at the fork (at least
MIN_UPPER), a tmpfs one charged to its sandbox's memory cgroup as before, a
disk one its own ext4 of that size (the parent keeps its own ext4, whose
free space that is). Depth (layers stacked) is at most ceilings.fork_depth;
only a fork with something to freeze adds one, and a fork past the bound
squashes the stack into one layer first (_squash, helper/squash.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

from camg.helper_wire import WireError
from helper import cgroups, uppers
from helper import squash as squash_tool
from helper.ledger import Record
from helper.sandbox import Sandbox, _kill_and_reap

log = logging.getLogger("camg.helper")
#: the smallest upper a fork makes (a full parent's child still has a work dir)
MIN_UPPER = 1 << 20
# Overlay options fit one page with the upper and work paths (sandbox_table).
_LOWERDIR_BYTES = 3584
# A squash past this is refused (helper/squash.py): well within the
# services' reset deadline (camg.config.service_config reset_timeout_s, 300 s by
# default), past which a fork is a failed reset with a null reward.
_SQUASH_SECONDS = 60.0


class Layer:
    """A frozen upper: read-only, shared by every sandbox stacking it."""

    def __init__(self, fd: int, sub: str) -> None:
        self.fd = fd
        self.sub = sub  # the upper's directory inside the handle's mount
        self.users = 0
        self.lock = threading.Lock()

    def acquire(self) -> None:
        with self.lock:
            if self.fd < 0:
                raise WireError("internal", "layer already released")
            self.users += 1

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or self.fd < 0:
                return
            fd, self.fd = self.fd, -1
        os.close(fd)

    def discard_if_unused(self) -> None:
        with self.lock:
            if self.users > 0 or self.fd < 0:
                return
            fd, self.fd = self.fd, -1
        os.close(fd)


def _stack(record: Record, layers: tuple[Layer, ...]) -> tuple[list[str], tuple[int, ...]]:
    """lowers bottom-first (base lowers, then layers) and the fds init gets at 5.."""
    paths = [f"/proc/self/fd/{5 + i}/{layer.sub}" for i, layer in enumerate(layers)]
    return [*record.lowers, *paths], tuple(layer.fd for layer in layers)


def _free_bytes(fd: int) -> int:
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize


def _check_idle(parent: Sandbox) -> None:
    """Refusals of a parent that cannot be forked now (its ops held)."""
    if parent.destroyed or parent.died:
        raise WireError(
            "sandbox_died" if parent.died else "not_found",
            f"sandbox {parent.id} is {'dead' if parent.died else 'destroyed'}",
        )
    others = [p for p in cgroups.procs(parent.record.cgroups["freezer"]) if p != parent.init_pid]
    if others:
        raise WireError(
            "not_allowed",
            f"processes: {len(others)} process(es) besides init "
            "still run in the sandbox; a fork carries the filesystem, not "
            "processes",
        )


def _untouched(fd: int, sub: str) -> bool:
    """True when the upper ``sub`` of the mount ``fd`` has no entry and is
    not opaque: the merged view is then exactly lowers + layers (read here,
    as root, never by anything in the sandbox). Other overlay xattrs on it
    (trusted.overlay.uuid, written at every mount) change no file."""
    top = f"/proc/self/fd/{fd}/{sub}"
    with os.scandir(top) as entries:
        if next(entries, None) is not None:
            return False
    # An opaque root would hide the lowers; overlayfs never marks its own
    # root so, but a reuse must not depend on that.
    return "trusted.overlay.opaque" not in os.listxattr(top)


def fork(registry, peer, parent: Sandbox) -> tuple[Sandbox, dict]:
    c = registry.config.ceilings
    spec = parent.spec
    if spec is None:
        raise WireError("not_allowed", "sandbox: the helper's own probe sandboxes cannot be forked")
    reused = _fork_over_stack(registry, peer, parent)
    if reused is not None:
        return reused
    if c.fork_depth < 1:
        raise WireError(
            "limit_exceeded", "fork_depth: this helper allows no layer (ceilings.fork_depth 0)"
        )
    child_id = secrets.token_hex(8)
    with registry.lock:
        registry._admit(peer, child_id)
    disk = bool(parent.record.upper_dir)
    child_upper = (
        os.path.join(registry.config.upper_root, cgroups.cgroup_name(child_id)) if disk else ""
    )
    record = Record(
        child_id,
        peer.uid,
        peer.owner,
        time.time(),
        cgroups.paths(registry.parents, child_id),
        child_upper,
        list(parent.record.lowers),
    )
    layer: Layer | None = None
    layers: tuple[Layer, ...] = ()
    made: dict = {}
    try:
        with parent.ops:
            _check_idle(parent)
            # Read under ops: a concurrent fork may have added a layer.
            depth = len(parent.layers) + 1
            lowers, _ = _stack(parent.record, parent.layers + (Layer(-1, "layer-" + "0" * 8),))
            # Past the bound the stack is squashed into one layer
            # (helper/squash.py) instead of refused: a tree search may go
            # as deep as it likes.
            squash = depth > c.fork_depth or len(":".join(lowers)) > _LOWERDIR_BYTES
            fd = parent.upper_handle()
            size = _free_bytes(fd)
            if squash:
                layer = _squash(registry, parent, fd, disk)
                stack: tuple[Layer, ...] = (layer,)
                depth = 1
                if disk:  # the copy is in the parent's ext4: less left
                    size = _free_bytes(fd)
            else:
                layer = Layer(fd, "u" if not disk else "layer-" + secrets.token_hex(4))
                stack = parent.layers + (layer,)
            size = max(MIN_UPPER, size)
            # The child's references, taken while the parent still holds its
            # own (a destroy of the parent cannot close them under the spawn).
            for each in stack:
                each.acquire()
                layers += (each,)
            lowers, fds = _stack(parent.record, layers)
            frozen = threading.Event()

            def make_child() -> None:
                try:
                    # The child's record (fsync'd) and cgroups, and its ext4,
                    # while the parent's init is killed and its upper frozen:
                    # none of them touches the parent's stack.
                    registry.ledger.write(record)
                    made["recorded"] = True
                    cgroups.create(
                        record.cgroups,
                        memory_bytes=spec.memory_bytes,
                        cpu_quota=spec.cpu_quota,
                        pids_max=spec.pids_max,
                    )
                    if disk:
                        _child_disk(registry, child_upper, size)
                    frozen.wait()
                    if "abort" in made:
                        return
                    made["child"] = Sandbox.spawn(
                        record,
                        init_binary=registry.init_binary,
                        hostname=spec.hostname,
                        scratch=registry.scratch,
                        lowers=lowers,
                        tmpfs_bytes=size,
                        shm=registry.config.ceilings.shm(spec.memory_bytes),
                        timeout=registry.config.create_timeout,
                        layer_fds=fds,
                    )
                except BaseException as exc:  # re-raised by the fork below
                    made["error"] = exc

            # Both inits come up at once (the two cores each take one).
            worker = threading.Thread(target=make_child, name=f"fork-{child_id}", daemon=True)
            worker.start()
            old_pid = parent.init_pid
            killed = False
            try:
                try:
                    # The frozen upper's only writer goes first: an overlay may
                    # not stack an upper another mounted overlay still writes.
                    # Dead is enough (its mounts are gone before it is a
                    # zombie); it is reaped once replaced, so its pid is never
                    # free while parent names it.
                    _kill_unreaped(old_pid)
                    killed = True
                    parent.ctl.close()
                    if disk and squash:
                        _clear_disk_upper(parent)  # copied into the squashed layer
                    elif disk:
                        # Before the child's init looks for the layer by name.
                        _freeze_disk_upper(parent, layer.sub)
                except BaseException:
                    made["abort"] = True
                    raise
                finally:
                    frozen.set()
                _replace_init(registry, parent, layers, lowers, fds, size, disk)
            finally:
                worker.join()
                if killed:
                    _reap(old_pid)
            if "error" in made:
                raise made["error"]
        child = made["child"]
        child.spec, child.size, child.layers = spec, size, layers
    except BaseException:
        if "child" in made:
            _kill_and_reap(made["child"].init_pid)
            made["child"].ctl.close()
        for each in layers:
            each.release()
        if made.get("recorded"):
            registry._forget(record)
        else:
            with registry.lock:
                registry.owners.pop(child_id, None)
        raise
    finally:
        if layer is not None:
            layer.discard_if_unused()
    with registry.lock:
        registry.sandboxes[child_id] = child
    return child, {"sandbox_id": child_id, "depth": depth, "upper_bytes": size, "reused": False}


def _fork_over_stack(registry, peer, parent: Sandbox) -> tuple[Sandbox, dict] | None:
    """The child of a parent that wrote nothing since it was made or last
    forked (its upper empty): a fresh upper over the parent's exact stack,
    the parent left running as it is, no new layer, no new depth. None when
    the upper holds anything (the caller freezes it instead)."""
    spec = parent.spec
    assert spec is not None  # fork() refuses probe sandboxes before calling this
    disk = bool(parent.record.upper_dir)
    layers: tuple[Layer, ...] = ()
    with parent.ops:
        _check_idle(parent)
        fd = parent.upper_handle()
        try:
            if not _untouched(fd, "upper" if disk else "u"):
                return None
            size = max(MIN_UPPER, _free_bytes(fd))
        finally:
            os.close(fd)
        # Taken under ops: a destroy of the parent releases its layers only
        # after it has held ops, so none is closed before the child has it.
        try:
            for each in parent.layers:
                each.acquire()
                layers += (each,)
        except BaseException:
            for each in layers:
                each.release()
            raise
    # From here the parent may run and write again: the child stacks none of
    # its upper, so it keeps the view the parent had at the check.
    child_id = secrets.token_hex(8)
    child_upper = (
        os.path.join(registry.config.upper_root, cgroups.cgroup_name(child_id)) if disk else ""
    )
    record = Record(
        child_id,
        peer.uid,
        peer.owner,
        time.time(),
        cgroups.paths(registry.parents, child_id),
        child_upper,
        list(parent.record.lowers),
    )
    admitted = recorded = False
    child: Sandbox | None = None
    try:
        with registry.lock:
            registry._admit(peer, child_id)
        admitted = True
        registry.ledger.write(record)
        recorded = True
        cgroups.create(
            record.cgroups,
            memory_bytes=spec.memory_bytes,
            cpu_quota=spec.cpu_quota,
            pids_max=spec.pids_max,
        )
        if disk:
            _child_disk(registry, child_upper, size)
        lowers, fds = _stack(parent.record, layers)
        child = Sandbox.spawn(
            record,
            init_binary=registry.init_binary,
            hostname=spec.hostname,
            scratch=registry.scratch,
            lowers=lowers,
            tmpfs_bytes=size,
            shm=registry.config.ceilings.shm(spec.memory_bytes),
            timeout=registry.config.create_timeout,
            layer_fds=fds,
        )
        child.spec, child.size, child.layers = spec, size, layers
    except BaseException:
        for each in layers:
            each.release()
        if recorded:
            registry._forget(record)
        elif admitted:
            with registry.lock:
                registry.owners.pop(child_id, None)
        raise
    with registry.lock:
        registry.sandboxes[child_id] = child
    return child, {
        "sandbox_id": child_id,
        "depth": len(layers),
        "upper_bytes": size,
        "reused": True,
    }


def _child_disk(registry, upper_dir: str, size: int) -> None:
    """The child's ext4 at ``upper_dir`` with ``size`` bytes free: a warm one
    when the pool has one (helper/upper_pool.py), else made now."""
    warm = registry.warm_uppers.take(size)
    if warm is not None:
        try:
            uppers.place(warm[1], upper_dir, size)
            return
        except OSError as exc:
            log.warning("warm upper not placed at %s, making one: %s", upper_dir, exc)
    uppers.create_disk(upper_dir, size)


def _kill_unreaped(pid: int) -> None:
    if pid <= 1:
        raise ValueError(f"refusing to kill pid {pid}")
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except (ProcessLookupError, ChildProcessError):
        pass  # reaped already by a concurrent destroy


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped already by a concurrent destroy


def _freeze_disk_upper(parent: Sandbox, sub: str) -> None:
    """A disk parent's ext4 keeps the frozen upper (as ``sub``, the layer's
    name) beside a fresh upper/, so its free space is what it had (ops held,
    its old init killed)."""
    top = parent.record.upper_dir
    try:
        os.rename(os.path.join(top, "upper"), os.path.join(top, sub))
        os.mkdir(os.path.join(top, "upper"), 0o755)
    except BaseException:
        # The old pid is reaped next and may then be reused: never signal it.
        parent.init_pid, parent.died = 0, True
        raise


def _squash(registry, parent: Sandbox, fd: int, disk: bool) -> Layer:
    """One layer holding what the parent's layers and its upper (the handle
    ``fd``, consumed) show over its lowers, made by helper/squash.py in the
    parent's memory cgroup (ops held, only init running: nothing writes
    any of them). A tmpfs parent's goes in a tmpfs of its own, held by its
    descriptor; a disk parent's beside its upper, in its ext4. Bounded by
    the parent's upper size; past it, or on anything the copied tree makes
    fail, the fork is refused limit_exceeded and nothing is kept."""
    assert parent.spec is not None  # fork() refuses probe sandboxes before calling this
    budget = parent.spec.upper_bytes or registry.config.tmpfs_upper_bytes
    sources = [f"/proc/self/fd/{each.fd}/{each.sub}" for each in parent.layers]
    sources.append(f"/proc/self/fd/{fd}/{'upper' if disk else 'u'}")
    name = "layer-" + secrets.token_hex(4)
    mnt = -1
    target = os.path.join(parent.record.upper_dir, name)
    try:
        if disk:
            os.mkdir(target, 0o755)
        else:
            mnt = uppers.detached_tmpfs(budget)
            target = f"/proc/self/fd/{mnt}/{name}"
            os.mkdir(target, 0o755)
        argv = [
            sys.executable,
            "-I",
            "-S",
            squash_tool.__file__,
            os.path.join(parent.record.cgroups["memory"], "cgroup.procs"),
            str(_SQUASH_SECONDS),
            target,
            str(len(parent.record.lowers)),
            *parent.record.lowers,
            *sources,
        ]
        fds = [each.fd for each in parent.layers] + [fd] + ([mnt] if mnt >= 0 else [])
        try:
            done = subprocess.run(
                argv, pass_fds=fds, capture_output=True, timeout=_SQUASH_SECONDS + 30
            )
        except subprocess.TimeoutExpired:  # one entry (a huge file) outlasted its own check
            raise WireError(
                "limit_exceeded",
                f"fork_depth: the stacked layers take longer than {_SQUASH_SECONDS:g} s to squash",
            ) from None
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            why = lines[-1] if lines else "no output"
            # The tree the agent wrote (or its memory limit) made it fail.
            refused = done.returncode in (squash_tool.REFUSED, -signal.SIGKILL)
            code = "limit_exceeded" if refused else "internal"
            raise WireError(
                code,
                f"fork_depth: {len(sources)} stacked layers could not be "
                f"squashed into one: {why[:300]}",
            )
        if disk:
            return Layer(fd, name)
        uppers.make_read_only(mnt)
        os.close(fd)
        return Layer(mnt, name)
    except BaseException:
        if mnt >= 0:
            os.close(mnt)  # the tmpfs and all of the copy go with it
        elif disk:
            shutil.rmtree(target, ignore_errors=True)
        os.close(fd)
        raise


def _clear_disk_upper(parent: Sandbox) -> None:
    """A disk parent whose upper was squashed gets a fresh upper/; the old
    one is deleted (no layer names it), so its space is free again."""
    top = parent.record.upper_dir
    stale = os.path.join(top, ".squashed-" + secrets.token_hex(4))
    try:
        os.rename(os.path.join(top, "upper"), stale)
        os.mkdir(os.path.join(top, "upper"), 0o755)
    except BaseException:
        # The old pid is reaped next and may then be reused: never signal it.
        parent.init_pid, parent.died = 0, True
        raise
    # Off the fork's path (its time is bounded by the bytes only through
    # the squash's own clock): a helper that dies first leaves it in the
    # parent's ext4, which goes with the parent.
    threading.Thread(
        target=shutil.rmtree,
        args=(stale,),
        kwargs={"ignore_errors": True},
        name="squashed-upper",
        daemon=True,
    ).start()


def _replace_init(registry, parent: Sandbox, layers, lowers, fds, size: int, disk: bool) -> None:
    """The parent continues over the frozen upper with a fresh one (ops held,
    its old init killed, a disk upper frozen already)."""
    spec = parent.spec
    assert spec is not None  # fork() refuses probe sandboxes before calling this
    try:
        fresh = Sandbox.spawn(
            parent.record,
            init_binary=registry.init_binary,
            hostname=spec.hostname,
            scratch=registry.scratch,
            lowers=lowers,
            tmpfs_bytes=size,
            shm=registry.config.ceilings.shm(spec.memory_bytes),
            timeout=registry.config.create_timeout,
            layer_fds=fds,
        )
    except BaseException:
        # The old pid is reaped next and may then be reused: never signal it.
        parent.init_pid, parent.died = 0, True
        raise
    for each in layers:
        each.acquire()
    old = parent.layers
    parent.init_pid, parent.ctl = fresh.init_pid, fresh.ctl
    parent.layers = layers
    if not disk:
        parent.size = size
    for each in old:
        each.release()
