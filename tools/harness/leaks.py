"""The privileged tests' leak check: a snapshot of the mounts of this mount
namespace, the cgroup directories below every camg* cgroup parent, the
children of this process (and of processes registered as allowed), the
entries of registered state roots and the labelled Docker containers; what
is new afterwards is a leak.

Things tagged with another live process's pid (``camg-test-PID-…``,
``camg-bench-…-PID``, scope ``test-PID-…``) are that run's business:
engineers share a machine; CI runs alone.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from camg import census as host
from tools.harness import census

CGROUP_ROOT = Path("/sys/fs/cgroup")
_TAGGED = re.compile(r"-(\d+)(?=-|$)")
# dockerd's own mounts (a container's rootfs, shm, netns): the containers are
# checked by label below; these come and go with any run's containers.
DOCKER_MOUNTS = ("/var/lib/docker/", "/run/docker/")


def foreign(name: str) -> bool:
    """Tagged with another live process's pid."""
    tag = _TAGGED.search(name)
    return bool(tag) and int(tag.group(1)) != os.getpid() and os.path.exists(f"/proc/{tag.group(1)}")


def camg_cgroups() -> set[str]:
    found = set()
    for ctrl in host.CONTROLLERS:
        for top in host.entries(CGROUP_ROOT / ctrl):
            if top.startswith("camg") and not foreign(top) and (CGROUP_ROOT / ctrl / top).is_dir():
                found.update(host.cgroup_tree(CGROUP_ROOT / ctrl / top))
    return found


def containers() -> set[str]:
    return {f"{c['Id'][:12]} ({census.scope_of(c)}, {c['Names'][0] if c['Names'] else ''})"
            for c in census.labelled_containers() if not foreign(census.scope_of(c))}


class LeakWatch:
    """What a test may leave running (session helpers, daemons), and what it may not."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.mount_prefixes: list[str] = []
        self.state_roots: list[Path] = []

    def allow_process(self, pid: int) -> None:
        self.pids.add(pid)

    def forget_process(self, pid: int) -> None:
        self.pids.discard(pid)

    def allow_mounts_under(self, prefix: str) -> None:
        self.mount_prefixes.append(prefix.rstrip("/") + "/")

    def state_root(self, path: Path) -> Path:
        """Register a directory whose new entries count as leaks."""
        self.state_roots.append(Path(path))
        return Path(path)

    def forget_state_under(self, base: Path) -> None:
        self.state_roots[:] = [r for r in self.state_roots if base not in r.parents]

    def snapshot(self) -> dict:
        return {"mounts": host.mount_points(), "cgroups": camg_cgroups(),
                "procs": host.children_of({os.getpid()} | self.pids),
                "state": {str(root / name) for root in self.state_roots
                          for name in host.entries(root)},
                "containers": containers()}

    def leaks(self, before: dict) -> list[str]:
        now = self.snapshot()
        leaks = []
        for mid, point in now["mounts"].items():
            if mid in before["mounts"] or any((point + "/").startswith(p)
                                              for p in (*self.mount_prefixes, *DOCKER_MOUNTS)):
                continue
            if any(foreign(part) for part in point.split("/") if part.startswith("camg")):
                continue
            leaks.append(f"mount {point}")
        leaks += [f"cgroup {c}" for c in sorted(now["cgroups"] - before["cgroups"])]
        leaks += [f"process {p} ({_cmdline(p)})"
                  for p in sorted(now["procs"] - before["procs"] - self.pids)]
        leaks += [f"state entry {s}" for s in sorted(now["state"] - before["state"])]
        leaks += [f"container {c}" for c in sorted(now["containers"] - before["containers"])]
        return leaks

    def settled_leaks(self, before: dict, settle: float = 15.0) -> list[str]:
        """Leaks still there after up to ``settle`` seconds (teardown is
        asynchronous; under CI's four lanes a helper's child took over 5 s
        to go). A clean check returns at once; only a leak waits it out."""
        deadline = time.monotonic() + settle
        leaks = self.leaks(before)
        while leaks and time.monotonic() < deadline:
            time.sleep(0.1)
            leaks = self.leaks(before)
        return leaks


#: This process's one watch: pytest loads tests/privileged/conftest.py as
#: ``conftest`` and fixtures modules import it again as
#: ``tests.privileged.conftest``; both instances register here.
WATCH = LeakWatch()


def _cmdline(pid: int) -> str:
    """What a leaked process runs, for the message (gone: say so)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "exited"
    return f"parent {ppid}: " + " ".join(a.decode(errors="replace") for a in argv if a)[:200]
