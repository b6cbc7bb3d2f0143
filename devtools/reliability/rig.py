"""The rig every suite runs on: a private camg-helper of this run and the
census of what it (and a service's state directory) holds, from the shared
harness (devtools/harness) with this run's tag.

The helper has its own socket, state directory, upper root and cgroup
parents, tagged with this process's pid (the privileged tests' leak check
then knows they are someone else's), so a census counts only what this run
made: ledger entries, uppers, sandbox cgroups, processes in them, sandbox
inits, host mounts naming the rig, Docker containers carrying its label;
and what only forks make: the frozen layers of forked sandboxes the helper
still holds (helper/forks.py) and the snapshot images of forked containers
(helper/container_fork.py).
"""

from __future__ import annotations

import os
import time

from camg.sandboxes import census as host
from devtools.harness import census
from devtools.harness.census import container_memory, rss_kib, state_strays  # noqa: F401
from devtools.harness.helpers import (  # noqa: F401
    CACHE,
    ROOT,
    HelperProcess,
    helper_config,
    minbase,
    private_base,
)

NAME = "rel"
#: every temporary directory of a run starts with this (its pid: a
#: parallel run's are told apart, tests/privileged/test_reliability_suites.py)
TMP_PREFIX = f"camg-{NAME}-{os.getpid()}-"


class Helper(HelperProcess):
    """A camg-helper of this run, removed completely by ``stop()``."""

    def __init__(self, lower_roots: list[str], *, ceilings: dict | None = None,
                 probes: bool = True, extra: dict | None = None) -> None:
        """``extra``: more helper.json (private_roots, a ``containers``
        section whose scope, if any, the container census then counts)."""
        base = private_base(NAME)
        config = helper_config(base, lower_roots, [str(minbase())], name=NAME,
                               probe_on_start=probes, ceilings=ceilings or {}, **(extra or {}))
        super().__init__(base, config, owner="reliability", owns_base=True)
        self.launch()

    def census(self) -> dict[str, int]:
        counted = super().census()
        counted["layers"] = self.layers() if self.alive() else 0
        counted["fork images"] = fork_images(self.scope) if self.scope else 0
        return counted


    def layers(self, settle_s: float = 10.0) -> int:
        """Fork layers held: the detached mounts of ``layers`` less the warm
        uppers the helper's pool holds (helper/upper_pool.py: also detached
        mounts, owned by no sandbox, not a leak). Counted between two equal
        pool readings with nothing being made, so an entry the pool is
        making is neither missed nor taken for a layer."""
        deadline = time.monotonic() + settle_s
        while True:
            before = self._pool()
            held = layers(self.proc.pid)
            if (before == self._pool() and not before["making"]) or time.monotonic() > deadline:
                return max(0, held - before["held"])
            time.sleep(0.1)

    def _pool(self) -> dict[str, int]:
        with self.client() as c:
            return c.ping().get("warm_uppers") or {"held": 0, "making": 0}


# O_PATH in /proc/<pid>/fdinfo's octal flags
_O_PATH = 0o10000000


def layers(pid: int) -> int:
    """Fork layers the helper ``pid`` holds: a layer is a detached clone of
    a mount (open_tree), held only by an O_PATH descriptor whose mount is in
    no mount table of the helper's namespace (helper/forks.py); its last
    user's destroy closes it, so one left after every sandbox went leaked."""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            mounted = {line.split()[0] for line in f}
    except (FileNotFoundError, ProcessLookupError):
        return 0  # no helper: the kernel closed whatever it held
    held = 0
    for fd in host.entries(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed while we looked
        if int(info.get("flags", "0").strip(), 8) & _O_PATH \
                and info.get("mnt_id", "").strip() not in mounted:
            held += 1
    return held


def fork_images(scope: str) -> int:
    """Docker images of the helper scope ``scope`` that a container fork
    committed (labels camg.helper=<scope>, camg.fork=1); 0 without Docker."""
    if not os.path.exists(census.DOCKER_SOCKET):
        return 0
    import docker
    api = docker.APIClient(base_url=f"unix://{census.DOCKER_SOCKET}", timeout=60)
    try:
        return len(api.images(filters={"label": [f"camg.helper={scope}", "camg.fork=1"]}))
    finally:
        api.close()


def scope(name: str) -> str:
    """The container scope of a helper of this run (``camg.helper`` label);
    tagged with our pid like the privileged tests' scopes, so their leak
    checks and sweeps leave it to us."""
    return f"{NAME}-{os.getpid()}-{name}"


def containers(scope: str | None = None) -> int:
    """Docker containers, running or not, of the helper scope ``scope``, or
    of every helper of this run; 0 without Docker."""
    if scope:
        return census.containers(scope)
    return sum(1 for c in census.labelled_containers()
               if census.scope_of(c).startswith(f"{NAME}-{os.getpid()}-"))
