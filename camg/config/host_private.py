"""Private directories on the host: grading material stays root's and the services'.

Preparation writes answers, grader layers, reference solutions and keys
under directories it makes with :func:`private_dir`: mode 0750, owner root,
group ``camg`` (the services' user, which reads them), so nobody else on the
host can enter them. The files inside keep the modes the sandbox needs: the
helper (root) mounts layers as overlay lowers, and inside a sandbox the agent
uid reads its repository through the files' "other" bits; only the host's
path to them is closed. ``python -m camg.host_audit`` checks the result.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

#: The services' user and group (units/sysusers.d/camg.conf).
SERVICE_GROUP = "camg"
PRIVATE_DIR_MODE = 0o750


def group_id(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def to_services(path: str | os.PathLike, group: str = SERVICE_GROUP) -> None:
    """Hand root's file at ``path`` to the services' group (when run as root
    and the group exists); its mode says what the group may do."""
    gid = group_id(group)
    if os.geteuid() == 0 and gid is not None:
        os.lchown(path, 0, gid)


def private_dir(
    path: str | os.PathLike, *, mode: int = PRIVATE_DIR_MODE, group: str = SERVICE_GROUP
) -> Path:
    """``path`` as a directory (made with its parents if missing) of ``mode``,
    owned by root and ``group`` when run as root.

    Made with the mode, not opened and then closed: nothing is ever
    world-readable in between. Where ``group`` does not exist (a test host
    without the camg accounts) the group stays root's: still private.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode & 0o700)
    except FileExistsError:
        pass
    if os.geteuid() == 0:
        gid = group_id(group)
        os.lchown(path, 0, 0 if gid is None else gid)
    # Explicit: neither the umask nor an earlier, looser install decides.
    os.chmod(path, mode)
    return path
