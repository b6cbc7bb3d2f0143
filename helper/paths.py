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


def resolve_lower(path: object, roots: tuple[str, ...]) -> str:
    """A real directory strictly below one of ``roots``, reached without symlinks."""
    clean = _clean_absolute(path, "lower")
    if _OVERLAY_SPECIAL & set(clean):
        raise WireError("bad_request", f"lower: {clean!r} contains a character overlayfs cannot take")
    for root in roots:
        root = os.path.normpath(root)
        if clean.startswith(root + "/"):
            break
    else:
        raise WireError("path_escape", f"lower: {clean!r} is not below a configured lower root")
    # Walk from the root down with lstat: a symlink anywhere (root included)
    # is refused rather than followed.
    current = "/"
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
    return clean


def sandbox_path(path: object, what: str) -> str:
    """An absolute, normalised path inside the sandbox, without '..'."""
    return _clean_absolute(path, what)
