"""The safe layer applier: one OCI layer tar onto a root directory.

Every path is resolved from an open directory descriptor of the root, one
component at a time with O_NOFOLLOW, so no symlink, whichever layer placed
it, can redirect a write, a hardlink or a whiteout outside the root. The
applier never follows a symlink inside the image at all: a parent component
that is a symlink rejects the layer (layers written by image builders
record real paths, so a legitimate layer never needs one).

Policies, chosen once here:

* ``..`` components and absolute names reject the layer; ``.`` is dropped.
* Relative symlinks whose target climbs above the root (lexically) reject
  the layer; absolute symlinks are kept as they are, because the sandbox
  resolves them against the image root, and nothing on the host follows
  links inside a materialized rootfs.
* Hardlinks must name an existing non-directory inside the root, resolved
  the same way; the link is made without following a symlink target.
* Device nodes and FIFOs are skipped (counted): a sandbox gets its own /dev.
* setuid/setgid bits are kept by default (real images need them, e.g. sudo
  or passwd); sandbox commands run with no_new_privs, so the kernel ignores
  them there. ``setuid="strip"`` clears both bits on non-directories.
* Ownership comes from the numeric uid/gid of the tar headers (user names
  are ignored: the host's passwd database is not the image's).
* Whiteouts (``.wh.NAME``) and opaque markers (``.wh..wh..opq``) remove
  lower-layer content only; an entry this same layer added survives them.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import shutil
import stat
import tarfile
from typing import Literal

from camg.errors import DatasetError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20

SetuidPolicy = Literal["keep", "strip"]


@dataclasses.dataclass(frozen=True)
class ApplyOptions:
    setuid: SetuidPolicy = "keep"
    # Without root the headers' owners cannot be applied; tests of the pure
    # path logic run unprivileged with chown=False.
    chown: bool = True


@dataclasses.dataclass
class LayerStats:
    entries: int = 0
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    whiteouts: int = 0
    skipped_devices: int = 0


class _Rejected(Exception):
    def __init__(self, entry: str, why: str) -> None:
        super().__init__(why)
        self.entry = entry
        self.why = why


def _split(name: str, entry: str, what: str) -> list[str]:
    if name.startswith("/"):
        raise _Rejected(entry, f"{what} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _Rejected(entry, f"{what} contains a '..' component")
    return parts


def _symlink_escapes(link_parts: list[str], target: str) -> bool:
    """True when a relative target climbs above the root from the link's directory."""
    depth = len(link_parts) - 1
    for part in target.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


class _Applier:
    def __init__(self, root_fd: int, options: ApplyOptions) -> None:
        self.root_fd = root_fd
        self.options = options
        self.stats = LayerStats()
        # Paths (tuples of components) this layer created: whiteouts and
        # opaque markers apply to lower layers only.
        self.added: set[tuple[str, ...]] = set()
        self.tmp_prefix = f".camg-apply-{secrets.token_hex(8)}-"
        self.tmp_count = 0

    # -- path resolution ---------------------------------------------------

    def _walk(self, parents: list[str], entry: str, create: bool) -> int | None:
        """An fd of the directory ``parents`` names, never through a symlink.

        Missing components are created (0755, root) when ``create``; else
        None is returned.
        """
        fd = os.dup(self.root_fd)
        try:
            for i, comp in enumerate(parents):
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    os.mkdir(comp, 0o700, dir_fd=fd)
                    self.added.add(tuple(parents[: i + 1]))
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                    os.chmod(nfd, 0o755)  # explicit: the umask must not decide
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = "/".join(parents[: i + 1])
                        raise _Rejected(entry, f"parent {where!r} is a symlink or not a directory") from None
                    raise
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise

    @staticmethod
    def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    @staticmethod
    def _remove(name: str, dir_fd: int, st: os.stat_result | None) -> None:
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)

    def _mode(self, member: tarfile.TarInfo, is_dir: bool) -> int:
        mode = member.mode & 0o7777
        if self.options.setuid == "strip" and not is_dir:
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
        return mode

    def _own(self, fd: int, member: tarfile.TarInfo) -> None:
        # chown before chmod: the kernel clears setuid bits on chown.
        if self.options.chown:
            os.chown(fd, member.uid, member.gid)

    # -- entries -------------------------------------------------------------

    def apply(self, tar: tarfile.TarFile, members=None) -> LayerStats:
        for member in (tar if members is None else members):
            self.stats.entries += 1
            try:
                self._entry(tar, member)
            except OSError as exc:
                # Names or ids the kernel refuses are the layer's fault;
                # anything else (ENOSPC, EIO) is the machine's and propagates.
                if exc.errno in (errno.ENAMETOOLONG, errno.EINVAL, errno.EOVERFLOW):
                    raise _Rejected(member.name, os.strerror(exc.errno)) from None
                raise
            except (OverflowError, ValueError) as exc:
                # Header values Python cannot pass to the kernel (a NUL in a
                # PAX link target, an out-of-range mtime or id).
                raise _Rejected(member.name, f"unusable header value ({exc})") from None
        return self.stats

    def _entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        entry = member.name
        parts = _split(member.name, entry, "name")
        if member.ischr() or member.isblk() or member.isfifo():
            self.stats.skipped_devices += 1
            return
        if not parts:
            if member.isdir():
                return  # the root itself stays 0755 root:root
            raise _Rejected(entry, "a non-directory entry names the root")
        base = parts[-1]
        if base.startswith(WHITEOUT):
            self._whiteout(parts, entry, member)
            return
        if any(p.startswith(WHITEOUT) for p in parts[:-1]):
            raise _Rejected(entry, "a whiteout name used as a directory")
        parent_fd = self._walk(parts[:-1], entry, create=True)
        try:
            existing = self._lstat(base, parent_fd)
            if member.isdir():
                self._dir(parent_fd, base, existing, member)
            elif member.isreg():
                self._file(parent_fd, base, existing, member, tar)
            elif member.issym():
                self._symlink(parent_fd, base, existing, member, parts)
            elif member.islnk():
                self._hardlink(parent_fd, base, existing, member)
            else:
                raise _Rejected(entry, f"unsupported tar entry type {member.type!r}")
        finally:
            os.close(parent_fd)
        self.added.add(tuple(parts))

    def _dir(self, parent_fd: int, base: str, existing, member) -> None:
        if existing is None or not stat.S_ISDIR(existing.st_mode):
            self._remove(base, parent_fd, existing)
            os.mkdir(base, 0o700, dir_fd=parent_fd)
        fd = os.open(base, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            self._own(fd, member)
            os.chmod(fd, self._mode(member, is_dir=True))
        finally:
            os.close(fd)
        self.stats.dirs += 1

    def _file(self, parent_fd: int, base: str, existing, member, tar) -> None:
        # Written under a fresh name and renamed over the old entry: rename
        # replaces a symlink instead of writing through it.
        self.tmp_count += 1
        tmp = f"{self.tmp_prefix}{self.tmp_count}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=parent_fd)
        try:
            try:
                source = tar.extractfile(member)
                while chunk := source.read(_CHUNK):
                    _write_all(fd, chunk)
                self._own(fd, member)
                os.chmod(fd, self._mode(member, is_dir=False))
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                shutil.rmtree(base, dir_fd=parent_fd)
            os.rename(tmp, base, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent_fd)
            except FileNotFoundError:
                pass
            raise
        self.stats.files += 1

    def _symlink(self, parent_fd: int, base: str, existing, member, parts) -> None:
        target = member.linkname
        if not target:
            raise _Rejected(member.name, "symlink with an empty target")
        if not target.startswith("/") and _symlink_escapes(parts, target):
            raise _Rejected(member.name, f"relative symlink target {target!r} leaves the root")
        self._remove(base, parent_fd, existing)
        os.symlink(target, base, dir_fd=parent_fd)
        if self.options.chown:
            os.chown(base, member.uid, member.gid, dir_fd=parent_fd, follow_symlinks=False)
        os.utime(base, (member.mtime, member.mtime), dir_fd=parent_fd, follow_symlinks=False)
        self.stats.symlinks += 1

    def _hardlink(self, parent_fd: int, base: str, existing, member) -> None:
        target_parts = _split(member.linkname, member.name, "hardlink target")
        if not target_parts:
            raise _Rejected(member.name, "hardlink to the root")
        target_fd = self._walk(target_parts[:-1], member.name, create=False)
        if target_fd is None:
            raise _Rejected(member.name, f"hardlink target {member.linkname!r} does not exist")
        try:
            target = self._lstat(target_parts[-1], target_fd)
            if target is None:
                raise _Rejected(member.name, f"hardlink target {member.linkname!r} does not exist")
            if stat.S_ISDIR(target.st_mode):
                raise _Rejected(member.name, f"hardlink target {member.linkname!r} is a directory")
            if existing is not None and (existing.st_dev, existing.st_ino) == (target.st_dev, target.st_ino):
                return
            self._remove(base, parent_fd, existing)
            os.link(target_parts[-1], base, src_dir_fd=target_fd, dst_dir_fd=parent_fd,
                    follow_symlinks=False)
        finally:
            os.close(target_fd)
        self.stats.hardlinks += 1

    def _whiteout(self, parts: list[str], entry: str, member) -> None:
        base = parts[-1]
        if base != OPAQUE:
            victim = base[len(WHITEOUT):]
            if victim in ("", ".", "..") or victim.startswith(WHITEOUT):
                raise _Rejected(entry, f"whiteout names {victim!r}")
        if member.isdir():
            raise _Rejected(entry, "a whiteout must not be a directory")
        parent_fd = self._walk(parts[:-1], entry, create=False)
        if parent_fd is None:
            self.stats.whiteouts += 1
            return  # nothing below to hide
        try:
            parent = tuple(parts[:-1])
            victims = os.listdir(parent_fd) if base == OPAQUE else [victim]
            for name in victims:
                if parent + (name,) in self.added:
                    continue
                self._remove(name, parent_fd, self._lstat(name, parent_fd))
        finally:
            os.close(parent_fd)
        self.stats.whiteouts += 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def apply_layer(root_fd: int, tar: tarfile.TarFile, *, image: str, layer: str,
                options: ApplyOptions = ApplyOptions(), members=None) -> LayerStats:
    """Apply one layer; a rejected entry raises DatasetError naming image, layer and entry.

    The root may be left partly changed on error: callers apply into a
    temporary directory and discard it (see tools.oci.cache).
    """
    try:
        return _Applier(root_fd, options).apply(tar, members)
    except _Rejected as exc:
        raise DatasetError(f"image {image}: layer {layer} rejected at entry {exc.entry!r}: {exc.why}",
                           image=image, layer=layer, entry=exc.entry, reason=exc.why) from None


def extract_tree(tar: tarfile.TarFile, dest: str | os.PathLike, *, what: str,
                 members=None, chown: bool = False) -> LayerStats:
    """Unpack an archive (an sdist, a ``git archive``) into the directory
    ``dest`` under the applier's rules: the project's safe extraction, and
    the same on every supported interpreter (tarfile's extraction filters
    arrived in Python 3.11.4; Debian bookworm has 3.11.2). Owners are not
    applied unless ``chown``: extracted files belong to the caller."""
    fd = os.open(dest, _DIR_FLAGS)
    try:
        return apply_layer(fd, tar, image=what, layer="archive",
                           options=ApplyOptions(chown=chown), members=members)
    finally:
        os.close(fd)
