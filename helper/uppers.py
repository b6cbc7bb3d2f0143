"""Disk uppers bounded like tmpfs ones.

A disk upper (``upper: "disk"``, AutoResearch's workspaces) is its own ext4
filesystem in a sparse file of ``upper_bytes`` under the upper root,
loop-mounted on the upper's directory: an agent filling it meets ENOSPC
(bytes) or the filesystem's inode count, never the host's disk. The file
is sparse, so only what the agent writes takes space.

Where loop devices are unavailable (a container without /dev/loop*), the
upper is a plain directory as before and the helper logs that it is
unbounded; ``bounded`` in the return value says which one was made.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess

log = logging.getLogger("camg.helper")
_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
         "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]


def image(upper_dir: str) -> str:
    return upper_dir + ".img"


def create_disk(upper_dir: str, size: int) -> bool:
    """upper_dir with upper/ and work/ inside; True when bounded by ``size``."""
    img = image(upper_dir)
    bounded = False
    fd = os.open(img, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    os.mkdir(upper_dir, 0o755)
    try:
        subprocess.run(_MKFS + [img], check=True, capture_output=True, timeout=120)
        subprocess.run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, upper_dir],
                       check=True, capture_output=True, timeout=60)
        bounded = True
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("disk upper %s is not bounded (no loop filesystem: %s %s)", upper_dir, exc,
                    detail.decode(errors="replace").strip()[:200])
        os.unlink(img)
    os.mkdir(os.path.join(upper_dir, "upper"), 0o755)
    os.mkdir(os.path.join(upper_dir, "work"), 0o700)
    return bounded


def remove(upper_dir: str) -> None:
    """Idempotent: unmount (lazily: a dying sandbox may still hold it), then
    remove the directory and its image; "already gone" is success."""
    if not upper_dir:
        return
    if os.path.ismount(upper_dir):
        # The loop device is set up with autoclear: it goes with the last
        # reference to the filesystem.
        out = subprocess.run(["umount", "-l", upper_dir], capture_output=True, timeout=60)
        if out.returncode != 0 and os.path.ismount(upper_dir):
            raise OSError(errno.EBUSY, f"cannot unmount {upper_dir}: "
                          f"{out.stderr.decode(errors='replace').strip()}")
    try:
        shutil.rmtree(upper_dir)
    except FileNotFoundError:
        pass  # already gone
    try:
        os.unlink(image(upper_dir))
    except FileNotFoundError:
        pass  # a plain (unbounded) upper, or already removed
