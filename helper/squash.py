"""Squash: a fork chain's frozen layers and upper merged into one layer.

When a fork would stack more than ceilings.fork_depth layers
(helper/forks.py), the parent's layers and its current upper, bottom-first,
are copied into one new directory that, stacked over the same base lowers,
shows exactly what the parent's overlay showed:

* a whiteout (a 0/0 character device) removes whatever the merged layers
  below it held at that name, and stays a whiteout only where a base lower
  holds the name and no opaque directory above hides it: overlayfs lists a
  directory only one layer has as it is, so a whiteout nothing needs would
  show up as an unreadable entry;
* an opaque directory (trusted.overlay.opaque) replaces what was there and
  stays opaque;
* a plain directory merges into a directory already there; over a
  whiteout or a non-directory it becomes opaque (the overlay stopped
  looking below that layer, so the base lowers must stay hidden);
* anything else (files, symlinks, devices, fifos) replaces what was there,
  with its owner, mode, times and xattrs (none of overlayfs' own), and
  hard links within one layer stay links.

This file runs as its own process (the helper spawns it with the layers'
descriptors), which joins the parent sandbox's memory cgroup first: the
copy's pages are charged to the episode that wrote them, as its upper's
were. Its bound is the target's filesystem: a tmpfs of the parent's upper
size, or the parent's own ext4; what was deleted or replaced on the way
frees its space again, so only what the parent's view holds counts. Past
it (ENOSPC), or on anything else the copied tree makes fail, it exits 3:
the fork is then refused, nothing kept. Stdlib only: it is started by
path, not as part of the package.

It also stops (exit 3) past SECONDS: a tree of many small files must not
make a fork outlast the service's reset deadline, which would record the
child as a failed reset (reward null) rather than a refused fork.

    squash.py MEMORY_PROCS SECONDS TARGET NLOWERS BASE_LOWER... SOURCE...
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import time

OPAQUE = "trusted.overlay.opaque"
_OVERLAY = "trusted.overlay."
# Present only with overlay features sbxinit never turns on (redirect_dir,
# metacopy): a layer carrying one is not a plain tree, so it is refused.
_UNSUPPORTED = ("trusted.overlay.redirect", "trusted.overlay.metacopy", "trusted.overlay.whiteout")
# Exit status of a refusal the tree caused (too big, too deep, unsupported).
REFUSED = 3


class Refused(Exception):
    pass


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _remove(path: str, st: os.stat_result | None) -> None:
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _xattrs(path: str) -> list[tuple[str, bytes]]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM):
            return []
        raise
    for name in names:
        if name.startswith(_UNSUPPORTED):
            raise Refused(f"{path}: {name} (an overlay feature squash does not carry)")
    return [
        (n, os.getxattr(path, n, follow_symlinks=False))
        for n in names
        if not n.startswith(_OVERLAY)
    ]


def _opaque(path: str) -> bool:
    try:
        value = os.getxattr(path, OPAQUE, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return False
        raise
    if value != b"y":  # "x": a directory of xwhiteouts, which overlayfs never makes
        raise Refused(f"{path}: {OPAQUE}={value!r}")
    return True


def _meta(src: str, dst: str, st: os.stat_result) -> None:
    for name, value in _xattrs(src):
        os.setxattr(dst, name, value, follow_symlinks=False)
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode))  # after chown, which clears set-id bits
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


class Merge:
    def __init__(self, base: list[str], seconds: float) -> None:
        self.base = base
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.links: dict[tuple[int, int], str] = {}

    def layer(self, src: str, dst: str) -> None:
        self.links = {}  # a link joins names of one layer only
        self._dir(src, dst, "", False)

    def _in_base(self, rel: str) -> bool:
        """Whether a base lower holds ``rel``, looked up as overlayfs does:
        a component that is not a directory ends the lookup in that lower
        (a symlink there is never followed, here or by the overlay)."""
        parts = rel.split("/")
        for base in self.base:
            path = base
            for i, part in enumerate(parts):
                path = os.path.join(path, part)
                st = _lstat(path)
                if st is None:
                    break
                if i == len(parts) - 1:
                    return True
                if not stat.S_ISDIR(st.st_mode):
                    break
        return False

    def _dir(self, src: str, dst: str, rel: str, hidden: bool) -> None:
        """``hidden``: an opaque directory at or above ``dst`` hides the base."""
        with os.scandir(src) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if time.monotonic() > self.deadline:
                raise Refused(f"the layers take longer than {self.seconds:g} s to squash")
            s, d = entry.path, os.path.join(dst, entry.name)
            r = os.path.join(rel, entry.name)
            st = os.lstat(s)
            there = _lstat(d)
            mode = st.st_mode
            if stat.S_ISCHR(mode) and st.st_rdev == 0:  # a whiteout
                _remove(d, there)
                if not hidden and self._in_base(r):
                    os.mknod(d, stat.S_IFCHR, 0)
            elif stat.S_ISDIR(mode):
                opaque = _opaque(s)
                if there is not None and stat.S_ISDIR(there.st_mode) and not opaque:
                    # merges, keeping an opacity it had
                    self._dir(s, d, r, hidden or _opaque(d))
                else:
                    _remove(d, there)
                    os.mkdir(d, 0o700)
                    if (opaque or there is not None) and not hidden:
                        os.setxattr(d, OPAQUE, b"y")
                    self._dir(s, d, r, hidden or opaque or there is not None)
                _meta(s, d, st)  # times after the entries
            else:
                _remove(d, there)
                self._other(s, d, st)

    def _other(self, s: str, d: str, st: os.stat_result) -> None:
        mode = st.st_mode
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and not stat.S_ISDIR(mode) and key in self.links:
            os.link(self.links[key], d)
            return
        if stat.S_ISREG(mode):
            fd_in = os.open(s, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fd_out = os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    done = 0
                    while done < st.st_size:
                        # sendfile: in-kernel, and across two tmpfs (which
                        # copy_file_range refuses between superblocks)
                        n = os.sendfile(fd_out, fd_in, done, min(st.st_size - done, 1 << 30))
                        if n == 0:
                            break  # shrank: nothing writes a frozen layer, so never
                        done += n
                finally:
                    os.close(fd_out)
            finally:
                os.close(fd_in)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(s), d)
        else:  # devices, fifos, sockets
            os.mknod(d, stat.S_IFMT(mode) | 0o600, st.st_rdev)
        _meta(s, d, st)
        if st.st_nlink > 1:
            self.links[key] = d


def merge(sources: list[str], target: str, base: list[str], seconds: float = 3600.0) -> None:
    """``sources`` bottom-first into the empty directory ``target``, to be
    stacked over the lowers ``base``, within ``seconds``."""
    m = Merge(base, seconds)
    for src in sources:
        m.layer(src, target)


def main(argv: list[str]) -> int:
    procs, seconds, target, n, *rest = argv
    base, sources = rest[: int(n)], rest[int(n) :]
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
    try:
        merge(sources, target, base, float(seconds))
    except Exception as exc:
        # Whatever the copied tree does to this copy (too big, too deep for
        # the recursion or PATH_MAX) is a refused fork, never a failed one:
        # a failed fork is a child episode with a null reward, and a tree
        # the agent wrote must not be able to make one.
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            exc = Refused("the merged layers exceed the sandbox's upper size")
        print(f"squash: {exc}", file=sys.stderr)
        return REFUSED
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
