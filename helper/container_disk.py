"""A container's writable layer bounded like a disk upper (helper/uppers.py).

Docker's overlay2 keeps a container's writable layer (every write to /,
/tmp, /work, /home...) in /var/lib/docker/overlay2/<layer>/diff on the data
root's filesystem, and sizes it (``--storage-opt size``) only on XFS with
project quotas, which this host's ext4 data root is not; moving the data
root needs dockerd restarted on another filesystem. So the mediator bounds
each container itself: between create and start, the layer directory
(diff/, work/, link, lower: what dockerd mounts the overlay from) is copied
onto a fresh ext4 filesystem in a sparse file of ``upper_bytes`` with
``upper_inodes`` inodes, loop-mounted over it. dockerd then mounts the
container's overlay with its upper there: the agent meets ENOSPC (bytes or
inodes), never the host's disk.

A fork (helper/container_fork.py) copies the parent's diff/ -- the overlay
upper as it stands, whiteouts (0:0 character devices) and opaque or
redirected directories (trusted.overlay.* xattrs) included -- into the
diff/ of a child created but not started, on the child's own bounded
filesystem of the same size (``copy_upper``): both share the image's lower
layers, so the child's overlay shows the parent's tree. A parent's upper
never holds more than that size, so the copy fits unless cp fills holes a
sparse file had (ENOSPC: limit_exceeded).

Before dockerd removes the container its layer is lazily unmounted: the
whole subtree (the overlay on merged/) leaves the host's view, the running
container keeps its own until it dies, and dockerd removes the original,
still-empty directory beneath. The loop device is autoclear: it goes with
the filesystem's last reference.

/dev/shm is a tmpfs of the helper's (container_ops: shm_bytes 64 MiB and
shm_inodes 4096, in place of Docker's, which bounds bytes only); /dev
(Docker's 64 MiB tmpfs, root-only) and the json-file log (max-size) are
bounded by Docker; tmpfs pages are charged to the container's memory
cgroup as well.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import tempfile

from camg.helper_wire import WireError

log = logging.getLogger("camg.helper")
_MOUNT_OPTS = "loop,nosuid,nodev,noatime"


def image(upper_root: str, cid: str) -> str:
    return os.path.join(upper_root, f"{cid}.img")


def layer_dir(inspected: dict) -> str | None:
    """The overlay2 layer directory of an inspected container (None for
    another storage driver: nothing here to bound)."""
    graph = inspected.get("GraphDriver") or {}
    upper = (graph.get("Data") or {}).get("UpperDir") if graph.get("Name") == "overlay2" else None
    return os.path.dirname(upper) if upper else None


def bound(layer: str, upper_root: str, cid: str, size: int, inodes: int) -> bool:
    """Put ``layer`` on its own bounded filesystem; True when bounded. Where
    loop devices are unavailable the layer stays on the data root and the
    helper logs it, as uppers.create_disk does."""
    os.makedirs(upper_root, mode=0o700, exist_ok=True)
    img = image(upper_root, cid)
    fd = os.open(img, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    stage = tempfile.mkdtemp(prefix=f".{cid[:12]}-", dir=upper_root)
    staged = False
    try:
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-N",
                str(inodes),
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                img,
            ]
        )
        _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTS, img, stage])
        staged = True
        _run(["cp", "-a", "--", layer + "/.", stage + "/"])
        shutil.rmtree(os.path.join(stage, "lost+found"), ignore_errors=True)
        _run(["umount", stage])
        staged = False
        _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTS, img, layer])
        return True
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning(
            "container %s: writable layer NOT bounded (%s %s)",
            cid[:12],
            exc,
            detail.decode(errors="replace").strip()[:200],
        )
        if staged:
            subprocess.run(["umount", "-l", stage], capture_output=True, timeout=60)
        _unlink(img)
        return False
    finally:
        try:
            os.rmdir(stage)
        except OSError:
            pass  # still mounted after a failed lazy unmount: the next sweep


def copy_upper(parent_layer: str, child_layer: str) -> None:
    """The parent's upper (diff/) into the child's empty one. The parent is
    frozen meanwhile (the caller's), the child not yet started: no overlay
    reads either upper while it changes. xattrs are required, not just
    attempted (--preserve=xattr after -a): an opaque directory or a
    whiteout's sense lives in them."""
    out = subprocess.run(
        [
            "cp",
            "-a",
            "--preserve=xattr",
            "--",
            os.path.join(parent_layer, "diff") + "/.",
            os.path.join(child_layer, "diff") + "/",
        ],
        capture_output=True,
        timeout=600,
    )
    if out.returncode != 0:
        detail = out.stderr.decode(errors="replace").strip()[:300]
        if "No space left" in detail or "Disk quota" in detail:
            raise WireError(
                "limit_exceeded", f"the parent's writable layer does not fit the child's: {detail}"
            )
        raise WireError("internal", f"copying the parent's writable layer failed: {detail}")


def release(layer: str | None, upper_root: str, cid: str) -> None:
    """Idempotent: detach the bounded filesystem from ``layer`` (lazily) and
    drop its image; "not mounted" and "already gone" are success."""
    if layer and os.path.ismount(layer):
        out = subprocess.run(["umount", "-l", layer], capture_output=True, timeout=60)
        if out.returncode != 0 and os.path.ismount(layer):
            raise OSError(
                errno.EBUSY,
                f"cannot unmount {layer}: {out.stderr.decode(errors='replace').strip()}",
            )
    _unlink(image(upper_root, cid))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # never made, or already released


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
