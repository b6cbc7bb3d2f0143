"""The privileged tests' leak check: a snapshot of the mounts of this mount
namespace, the cgroup directories below every camg* cgroup parent, the
children of this process (and of processes registered as allowed), the
entries of registered state roots and the labelled Docker containers; what
is new afterwards is a leak.

Things tagged with another live process's pid (``camg-test-PID-…``,
``camg-bench-…-PID``, scope ``test-PID-…``) are that run's business:
engineers share a machine, and CI's lanes run side by side. "Live" means a
process that was already running when the thing last changed: a killed
run's leftovers carry a dead pid that the kernel hands to later processes,
and judged by liveness alone they left and re-entered the snapshots as
those processes came and went (a warm rehearsal after a killed one failed
a helper test's teardown on a cgroup tree a killed run had left two hours
before).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from camg.sandboxes import census as host
from devtools.harness import census

CGROUP_ROOT = Path("/sys/fs/cgroup")
_TAGGED = re.compile(r"-(\d+)(?=-|$)")
# dockerd's own mounts (a container's rootfs, shm, netns): the containers are
# checked by label below; these come and go with any run's containers.
DOCKER_MOUNTS = ("/var/lib/docker/", "/run/docker/")


def foreign(name: str, changed: float | None = None) -> bool:
    """Tagged with another live process's pid, of a process that started
    before ``changed`` (when the thing last changed, wall-clock seconds;
    None: not known, liveness alone decides)."""
    tag = _TAGGED.search(name)
    if not tag or int(tag.group(1)) == os.getpid():
        return False
    started = _started(int(tag.group(1)))
    if started is None:
        return False
    # half a second of slack: clock ticks, and the two clocks' reading
    return changed is None or started <= changed + 0.5


def _started(pid: int) -> float | None:
    """When ``pid``'s process started (wall-clock seconds), None if none runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    # the start is in ticks since boot; the boot's wall-clock time read now
    # (not /proc/stat's btime, which is whole seconds)
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _changed(path: Path | str) -> float | None:
    # ctime: no copy or utime sets it back (cp -a keeps a source's mtime)
    try:
        return os.stat(path).st_ctime
    except OSError:
        return None


def camg_cgroups() -> set[str]:
    found = set()
    for ctrl in host.CONTROLLERS:
        for top in host.entries(CGROUP_ROOT / ctrl):
            path = CGROUP_ROOT / ctrl / top
            if top.startswith("camg") and not foreign(top, _changed(path)) and path.is_dir():
                found.update(host.cgroup_tree(path))
    return found


def containers() -> set[str]:
    return {f"{c['Id'][:12]} ({census.scope_of(c)}, {c['Names'][0] if c['Names'] else ''})"
            for c in census.labelled_containers()
            if not foreign(census.scope_of(c), c.get("Created"))}


def _foreign_mount(point: str) -> bool:
    """A mount below a directory tagged as another live run's."""
    parts = point.split("/")
    return any(foreign(part, _changed("/".join(parts[:i + 1])))
               for i, part in enumerate(parts) if part.startswith("camg"))


class LeakWatch:
    """What a test may leave running (session helpers, daemons), and what it may not."""

    def __init__(self) -> None:
        #: allowed pid -> its process's start (None: already gone): a pid the
        #: kernel gave to another process since (CI's system lane boots
        #: nspawn guests beside this run) is not the allowed process
        self.allowed: dict[int, float | None] = {}
        self.mount_prefixes: list[str] = []
        self.state_roots: list[Path] = []

    def allow_process(self, pid: int) -> None:
        self.allowed[pid] = _started(pid)

    def forget_process(self, pid: int) -> None:
        self.allowed.pop(pid, None)

    @property
    def pids(self) -> set[int]:
        """The allowed processes still running (not their pids' later owners)."""
        return {pid for pid, started in self.allowed.items()
                if started is not None and _same_start(_started(pid), started)}

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
            if _foreign_mount(point):
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


def _same_start(now: float | None, then: float) -> bool:
    # two readings of one start differ by the uptime clock's drift only
    return now is not None and abs(now - then) < 0.5


def _cmdline(pid: int) -> str:
    """What a leaked process runs, for the message (gone: say so)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "exited"
    return f"parent {ppid}: " + " ".join(a.decode(errors="replace") for a in argv if a)[:200]
