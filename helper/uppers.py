"""Disk uppers bounded like tmpfs ones.

A disk upper (``upper: "disk"``, AutoResearch's workspaces) is its own ext4
filesystem in a sparse file of ``upper_bytes`` under the upper root,
loop-mounted on the upper's directory: an agent filling it meets ENOSPC
(bytes) or the filesystem's inode count, never the host's disk. The file
is sparse, so only what the agent writes takes space.

Where loop devices are unavailable (a container without /dev/loop*), the
upper is a plain directory as before and the helper logs that it is
unbounded; ``bounded`` in the return value says which one was made.

A warm upper (``make_warm``, for helper/upper_pool.py) is the same ext4,
made ahead of need and held by one descriptor only: its image is an
O_TMPFILE (no name), its loop device autoclears, and its filesystem is a
detached mount (fsmount, no mount point). ``place`` reserves what the new
sandbox may not use and attaches it where ``create_disk`` would have
mounted a fresh one; a warm upper never placed goes with its descriptor, so
a helper that dies leaves nothing of it for the sweep to find.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess

log = logging.getLogger("camg.helper")
_MKFS = [
    "mkfs.ext4",
    "-q",
    "-F",
    "-m",
    "0",
    "-O",
    "^has_journal",
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
]


# The new mount API's syscalls (one number on every architecture since 5.1).
_MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _MOUNT_SETATTR = 429, 430, 431, 432, 442
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOATIME = 0x1, 0x2, 0x4, 0x10
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100
_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE, _LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
# struct loop_config: fd, block_size, loop_info64 (232 bytes), 8 reserved u64s;
# lo_flags sits at offset 52 of loop_info64.
_LOOP_CONFIG = struct.Struct("=II52xI176x64x")
# Where the bytes a placed upper may not use are held (outside upper/ and
# work/, so no overlay shows it).
RESERVE = ".reserved"
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(nr: int, *args) -> int:
    r = _libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r


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
        subprocess.run(
            ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, upper_dir],
            check=True,
            capture_output=True,
            timeout=60,
        )
        bounded = True
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning(
            "disk upper %s is not bounded (no loop filesystem: %s %s)",
            upper_dir,
            exc,
            detail.decode(errors="replace").strip()[:200],
        )
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
            raise OSError(
                errno.EBUSY,
                f"cannot unmount {upper_dir}: {out.stderr.decode(errors='replace').strip()}",
            )
    try:
        shutil.rmtree(upper_dir)
    except FileNotFoundError:
        pass  # already gone
    try:
        os.unlink(image(upper_dir))
    except FileNotFoundError:
        pass  # a plain (unbounded) upper, or already removed


def make_warm(upper_root: str, size: int) -> int:
    """A formatted ext4 of ``size`` bytes with upper/ and work/, attached to
    an autoclearing loop device and mounted nowhere: its descriptor, the
    only thing holding it (the caller closes it, or ``place`` does)."""
    img = os.open(upper_root, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(img, size)
        subprocess.run(
            _MKFS + [f"/proc/self/fd/{img}"],
            check=True,
            capture_output=True,
            timeout=120,
            pass_fds=(img,),
        )
        loop = _attach(img)
    finally:
        os.close(img)  # the loop device holds the image now
    try:
        fs = _syscall(_FSOPEN, b"ext4", ctypes.c_long(_FSOPEN_CLOEXEC))
        try:
            _syscall(
                _FSCONFIG,
                ctypes.c_long(fs),
                ctypes.c_long(_FSCONFIG_SET_STRING),
                b"source",
                f"/dev/loop{loop[1]}".encode(),
                ctypes.c_long(0),
            )
            # A fresh sparse image reads as zeros already: nothing for the
            # lazy inode-table initialiser to write.
            _syscall(
                _FSCONFIG,
                ctypes.c_long(fs),
                ctypes.c_long(_FSCONFIG_SET_FLAG),
                b"noinit_itable",
                None,
                ctypes.c_long(0),
            )
            _syscall(
                _FSCONFIG,
                ctypes.c_long(fs),
                ctypes.c_long(_FSCONFIG_CMD_CREATE),
                None,
                None,
                ctypes.c_long(0),
            )
            mnt = _syscall(
                _FSMOUNT,
                ctypes.c_long(fs),
                ctypes.c_long(_FSMOUNT_CLOEXEC),
                ctypes.c_long(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOATIME),
            )
        finally:
            os.close(fs)
    finally:
        os.close(loop[0])  # autoclear: the device goes with the filesystem
    try:
        os.mkdir("upper", 0o755, dir_fd=mnt)
        os.mkdir("work", 0o700, dir_fd=mnt)
    except BaseException:
        os.close(mnt)
        raise
    return mnt


def detached_tmpfs(size: int) -> int:
    """A tmpfs of ``size`` bytes (and one inode a 4 KiB of it) mounted
    nowhere: its descriptor, the only thing holding it (a squashed layer,
    helper/squash.py). Writable until ``make_read_only``."""
    fs = _syscall(_FSOPEN, b"tmpfs", ctypes.c_long(_FSOPEN_CLOEXEC))
    try:
        for key, value in (
            ("size", str(size)),
            ("nr_inodes", str(max(4096, size // 4096))),
            ("mode", "0755"),
        ):
            _syscall(
                _FSCONFIG,
                ctypes.c_long(fs),
                ctypes.c_long(_FSCONFIG_SET_STRING),
                key.encode(),
                value.encode(),
                ctypes.c_long(0),
            )
        _syscall(
            _FSCONFIG,
            ctypes.c_long(fs),
            ctypes.c_long(_FSCONFIG_CMD_CREATE),
            None,
            None,
            ctypes.c_long(0),
        )
        return _syscall(
            _FSMOUNT,
            ctypes.c_long(fs),
            ctypes.c_long(_FSMOUNT_CLOEXEC),
            ctypes.c_long(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOATIME),
        )
    finally:
        os.close(fs)


def make_read_only(mnt: int) -> None:
    """The detached mount ``mnt`` read-only from now on (mount_setattr)."""
    attr = struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)
    _syscall(
        _MOUNT_SETATTR,
        ctypes.c_long(mnt),
        b"",
        ctypes.c_long(_AT_EMPTY_PATH),
        attr,
        ctypes.c_long(len(attr)),
    )


def _attach(img: int) -> tuple[int, int]:
    """(descriptor, number) of a free loop device now backed by ``img``."""
    with open("/dev/loop-control", "rb", buffering=0) as ctl:
        for _ in range(16):
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            fd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, _LOOP_CONFIG.pack(img, 0, _LO_FLAGS_AUTOCLEAR))
                return fd, number
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EBUSY:
                    raise
                # another process configured it between GET_FREE and ours
    raise OSError(errno.EBUSY, "no free loop device after 16 tries")


def place(mnt: int, upper_dir: str, size: int) -> None:
    """Attach the warm upper ``mnt`` at ``upper_dir`` (made here, as
    ``create_disk`` does) with only ``size`` bytes free: the rest is
    allocated to RESERVE. Consumes ``mnt`` either way."""
    try:
        st = os.fstatvfs(mnt)
        extra = st.f_bavail * st.f_frsize - size
        if extra > 0:
            fd = os.open(
                RESERVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=mnt
            )
            try:
                os.posix_fallocate(fd, 0, extra)
            finally:
                os.close(fd)
        os.mkdir(upper_dir, 0o755)
        try:
            _syscall(
                _MOVE_MOUNT,
                ctypes.c_long(mnt),
                b"",
                ctypes.c_long(_AT_FDCWD),
                upper_dir.encode(),
                ctypes.c_long(_MOVE_MOUNT_F_EMPTY_PATH),
            )
        except BaseException:
            os.rmdir(upper_dir)
            raise
    finally:
        os.close(mnt)
