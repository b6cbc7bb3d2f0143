"""What a camg-helper's sandboxes hold on the host, counted from outside it.

One census for three readers: ``camg status`` (an installation's leftovers,
camg/status.py), the harness's private helpers (devtools/harness: what a
reliability suite or a benchmark left) and the privileged tests' leak check
(what a test left). Standard library only, and reading only: it is run as
root next to a live helper and must never change what it counts.
"""

from __future__ import annotations

import os
from pathlib import Path

CONTROLLERS = ("cpu", "memory", "pids", "freezer")


def entries(path: str | Path) -> list[str]:
    """The names in a directory, sorted; none when it does not exist."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def mount_points() -> dict[str, str]:
    """Mount id -> mount point, of this process's mount namespace."""
    with open("/proc/self/mountinfo") as f:
        return {fields[0]: fields[4] for fields in (line.split() for line in f)}


def mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    """Mount points below any of the directories ``prefixes`` (a directory
    that is itself a mount point, /var/lib/camg on a disk of its own, is no
    sandbox's)."""
    wanted = tuple(p.rstrip("/") + "/" for p in prefixes)
    return sorted(p for p in mount_points().values() if p.startswith(wanted))


def cgroup_tree(base: str | Path) -> list[str]:
    """Every cgroup directory below ``base`` (not ``base`` itself)."""
    found = []
    for dirpath, dirnames, _ in os.walk(base):
        found += [os.path.join(dirpath, d) for d in dirnames]
    return sorted(found)


def cgroup_processes(dirs: list[str]) -> list[int]:
    pids = []
    for path in dirs:
        try:
            pids += [int(p) for p in Path(path, "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            pass  # removed while we looked
    return pids


def children_of(parents: set[int]) -> set[int]:
    """Children of any of ``parents``, from each thread's children list
    (a child is listed by the thread that forked it): a few small reads,
    where a pass over all of /proc took ~20 ms on a loaded machine (the leak
    check runs twice per test)."""
    kids: set[int] = set()
    for parent in parents:
        for tid in entries(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids.update(int(p) for p in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                pass  # the thread exited between the listing and the read
    return kids


def holdings(
    config: dict, cgroup_dirs: list[Path], mount_prefixes: tuple[str, ...]
) -> dict[str, list[str]]:
    """What the helper of ``config`` (its helper.json) holds: ledger records,
    overlay uppers, sandbox cgroups below ``cgroup_dirs`` (a supervisor's
    own cgroup is the helper's, not a sandbox's), the processes in them and
    the mounts below ``mount_prefixes``."""
    cgroups = [
        d for base in cgroup_dirs for d in cgroup_tree(base) if not d.endswith("/supervisor")
    ]
    return {
        "ledger records": entries(Path(config["state_dir"]) / "ledger"),
        "uppers": entries(config["upper_root"]),
        "cgroups": cgroups,
        "processes": [str(p) for p in cgroup_processes(cgroups)],
        "mounts": mounts_under(mount_prefixes),
    }
