"""A cgroup of one nspawn run's own, in the hierarchies nspawn uses.

nspawn --keep-unit puts its payload/ and supervisor/ cgroups below the cgroup
it was started in. Without systemd as PID 1 that is the host's root, shared
with every other nspawn on the machine; each run here gets its own instead,
and removes it afterwards.
"""

from __future__ import annotations

import errno
import os
import re
import uuid
from pathlib import Path

from devtools.harness.leaks import foreign

CGROOT = Path("/sys/fs/cgroup")
NSPAWN_HIERARCHIES = ("systemd", "unified")
#: what a run's cgroups are named: its own, and its guest dockerd's below the
#: cgroup the run was started in (systest_docker.docker_cgroup_dirs)
_RUN_CGROUP = re.compile(r"camg-systest-(\d+)-[0-9a-f]{8}(-docker)?")
#: how deep below a hierarchy's root a run's cgroups are looked for: the
#: cgroup a run starts in may be a few levels down (a session's scope)
_SWEEP_DEPTH = 4


def rmdir_tree(top: Path) -> list[str]:
    """rmdir a cgroup subtree bottom-up; returns what could not be removed."""
    stuck: list[str] = []
    if not top.is_dir():
        return stuck
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda e: -len(e[0])):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # EBUSY: processes are still in it, which is a leak to report.
            stuck.append(f"{dirpath}: {errno.errorcode.get(exc.errno, exc.errno)}")
    return stuck


def children(top: Path) -> list[str]:
    return sorted(str(Path(d).relative_to(top)) for d, _s, _f in os.walk(top) if Path(d) != top)


def sweep_stale() -> list[str]:
    """Remove the cgroups of runs that were killed before their teardown
    (their pid is dead, or now another process's): empty directories only,
    so nothing running is touched. Returns what stayed (a process still in
    it)."""
    stuck: list[str] = []
    for hierarchy in (CGROOT.iterdir() if CGROOT.is_dir() else ()):
        level = [hierarchy]
        for _ in range(_SWEEP_DEPTH):
            below = []
            for parent in level:
                try:
                    entries = list(os.scandir(parent))
                except OSError:
                    continue
                for entry in entries:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    path = Path(entry.path)
                    run = _RUN_CGROUP.fullmatch(entry.name)
                    if run is None:
                        below.append(path)
                    elif int(run.group(1)) != os.getpid() and not foreign(
                        entry.name, os.stat(path).st_ctime
                    ):
                        stuck += rmdir_tree(path)
            level = below
    return stuck


class OwnCgroup:
    def __init__(self, prefix: str = "camg-systest") -> None:
        # Tagged with this pytest's pid: the privileged tier's leak check,
        # running beside this one (packaging/run-tests.sh lanes), leaves
        # cgroups of another live run alone.
        self.name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.paths = [CGROOT / h / self.name for h in NSPAWN_HIERARCHIES]

    def create(self) -> "OwnCgroup":
        # A killed run's cgroups are left where its own were made; this
        # run is the next that looks.
        sweep_stale()
        for path in self.paths:
            path.mkdir()
        return self

    def preexec(self) -> None:
        """Runs in the child before exec: move it into this cgroup."""
        for path in self.paths:
            with open(path / "cgroup.procs", "w") as f:
                f.write("0")

    def remove(self) -> list[str]:
        stuck: list[str] = []
        for path in self.paths:
            stuck += rmdir_tree(path)
        return stuck
