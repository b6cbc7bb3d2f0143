"""Resolution of client-supplied paths, on the host and inside a sandbox.

Host paths (lowers) are accepted only below a configured root and only if no
component is a symlink: the helper never follows a link a client could have
planted. Sandbox paths are only normalised here; they are resolved by
processes running inside the sandbox's own root, where no symlink can lead
out of it.
"""

from __future__ import annotations

import os
import stat

from camg.helper_wire import WireError

# Characters that would change the meaning of overlayfs's option string.
_OVERLAY_SPECIAL = set(",:\\=\n")


def _clean_absolute(path: object, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise WireError("bad_request", f"{what}: expected a non-empty string")
    if "\0" in path or len(path) > 4096:
        raise WireError("bad_request", f"{what}: contains NUL or is too long")
    if not path.startswith("/"):
        raise WireError("path_escape", f"{what}: {path!r} is not absolute")
    if any(part == ".." for part in path.split("/")):
        raise WireError("path_escape", f"{what}: {path!r} contains '..'")
    return os.path.normpath(path)


def resolve_lower(path: object, roots: tuple[str, ...], private: tuple[str, ...] = ()) -> str:
    """A real directory strictly below one of ``roots``, reached without symlinks,
    that neither is, lies in, nor contains one of the ``private`` roots."""
    clean = _clean_absolute(path, "lower")
    if _OVERLAY_SPECIAL & set(clean):
        raise WireError(
            "bad_request", f"lower: {clean!r} contains a character overlayfs cannot take"
        )
    for root in roots:
        root = os.path.normpath(root)
        if clean.startswith(root + "/"):
            break
    else:
        raise WireError("path_escape", f"lower: {clean!r} is not below a configured lower root")
    # Walk from the root down with lstat: a symlink anywhere (root included)
    # is refused rather than followed.
    current = "/"
    walked: list[tuple[int, int]] = []
    for part in clean.strip("/").split("/"):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise WireError("not_found", f"lower: {current!r} does not exist") from None
        if stat.S_ISLNK(st.st_mode):
            raise WireError("path_escape", f"lower: {current!r} is a symlink")
        if not stat.S_ISDIR(st.st_mode):
            raise WireError("bad_request", f"lower: {current!r} is not a directory")
        walked.append((st.st_dev, st.st_ino))
    refuse_private(clean, walked, private)
    return clean


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _identities(root: str) -> tuple[tuple[int, int] | None, set[tuple[int, int]]]:
    """(dev, ino) of a private root and of every directory above it."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None, set()
    above = set()
    parent = root
    while parent != "/":
        parent = os.path.dirname(parent)
        p = os.stat(parent)
        above.add((p.st_dev, p.st_ino))
    return (st.st_dev, st.st_ino), above


def refuse_private(clean: str, walked: list[tuple[int, int]], private: tuple[str, ...]) -> None:
    """Checked after resolution, by path and by identity: a lower reached
    through a bind mount of a private root (or of a directory holding one)
    is refused as surely as the private path itself."""
    for root in private:
        root = os.path.normpath(root)
        if _overlap(clean, root):
            raise WireError("path_escape", f"lower: {clean!r} overlaps a private root")
        ident, above = _identities(root)
        if ident is None or not walked:
            continue
        if ident in walked or walked[-1] in above:
            raise WireError(
                "path_escape", f"lower: {clean!r} reaches a private root through a mount"
            )
        # A bind of a directory inside the private root has an identity of
        # its own: compare where both paths lie within their filesystems.
        lower_fs, private_fs = _fs_location(clean), _fs_location(root)
        if lower_fs[0] == private_fs[0] and _overlap(lower_fs[1], private_fs[1]):
            raise WireError("path_escape", f"lower: {clean!r} is mounted from a private root")


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _fs_location(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """(device, path within that filesystem) of ``path``, from the mount
    table: the longest mount point holding it (the last one mounted wins)."""
    best: tuple[int, str, str] = (-1, "", "")
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            devno, fs_root, point = fields[2], _unescape(fields[3]), _unescape(fields[4])
            if path == point or path.startswith(point.rstrip("/") + "/"):
                if len(point) >= best[0]:
                    rel = os.path.relpath(path, point)
                    best = (len(point), devno, os.path.normpath(os.path.join(fs_root, rel)))
    return best[1], best[2]


def probe_private_roots(
    lower_roots: tuple[str, ...], private: tuple[str, ...], other_paths: tuple[str, ...]
) -> None:
    """The start-up probe of the deny-list: every private root is refused as a
    lower (and so is anything overlapping it), and no configured root or
    directory the helper writes to reaches one. Raises ValueError naming it."""
    for root in private:
        root = os.path.normpath(root)
        for other in lower_roots + other_paths:
            if _overlap(os.path.normpath(other), root):
                raise ValueError(f"private root {root} overlaps configured path {other}")
        ident, above = _identities(root)
        for other in lower_roots:
            try:
                st = os.stat(other)
            except FileNotFoundError:
                continue
            if ident is not None and (
                (st.st_dev, st.st_ino) == ident or (st.st_dev, st.st_ino) in above
            ):
                raise ValueError(
                    f"lower root {other} is (a mount of) private root {root} "
                    "or a directory holding it"
                )
        if ident is None:
            continue
        try:
            resolve_lower(root, tuple(lower_roots) + (os.path.dirname(root),), private)
        except WireError as exc:
            if exc.name != "path_escape":
                raise ValueError(
                    f"private root {root}: the deny-list probe got {exc.name}, not path_escape"
                ) from None
        else:
            raise ValueError(f"private root {root} was accepted as a lower")


def sandbox_path(path: object, what: str) -> str:
    """An absolute, normalised path inside the sandbox, without '..'."""
    return _clean_absolute(path, what)
