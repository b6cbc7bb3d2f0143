"""The helper's typed configuration and the ceilings it puts on clients.

Everything is optional; defaults suit a systemd deployment. The file is JSON,
parsed strictly (unknown or mistyped fields are a ConfigError naming the
field) and validated before the helper binds anything or sends READY=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from types import MappingProxyType

from camg.helper_wire import SANDBOXES_PER_PEER, parse
from helper.container_config import ContainerConfig

CONTROLLERS = ("cpu", "memory", "pids", "freezer")


class ConfigError(ValueError):
    """The helper's configuration is invalid (names the field or file)."""


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Upper bounds for anything a client may ask for."""

    memory_bytes: int = 8 << 30
    cpu_quota: float = 4.0
    pids_max: int = 4096
    timeout: float = 3600.0
    output_bytes: int = 1 << 20
    archive_bytes: int = 64 << 20
    sandboxes_per_peer: int = SANDBOXES_PER_PEER
    sandboxes_total: int = 1024
    env_entries: int = 256
    command_bytes: int = 128 << 10
    upper_bytes: int = 16 << 30
    # Overlay lowers per sandbox (each is a path resolved and mounted).
    lowers: int = 16
    # Frozen layers a fork chain may stack (ForkSandbox, helper/forks.py).
    fork_depth: int = 8
    # Disk uppers kept formatted and attached ahead of forks
    # (helper/upper_pool.py): each one loop device and an unnamed sparse
    # image; 0 keeps none (forks then make their own).
    warm_uppers: int = 4
    # Connections served at once; each holds one thread and at most one
    # request in flight, so this also bounds concurrent requests.
    connections: int = 1024
    # A sandbox's /dev/shm (a tmpfs of its own, sbxinit.c): at most this
    # many bytes, and never more than half its memory_bytes, so that a fill
    # meets ENOSPC before the memory cgroup (which its pages are charged
    # to) meets the OOM killer; at most shm_inodes files. Docker's is
    # 64 MiB as well.
    shm_bytes: int = 64 << 20
    shm_inodes: int = 4096

    def shm(self, memory_bytes: int) -> tuple[int, int]:
        """/dev/shm's (size, nr_inodes) for a sandbox of ``memory_bytes``;
        both positive (0 would mean unlimited to tmpfs)."""
        return max(4096, min(self.shm_bytes, memory_bytes // 2)), self.shm_inodes


@dataclasses.dataclass(frozen=True)
class HelperConfig:
    socket: str = "/run/camg/helper.sock"
    group: str = "camg"
    state_dir: str = "/run/camg-helper"
    lower_roots: tuple[str, ...] = ("/var/lib/camg/oci-rootfs", "/var/lib/camg/task-layers")
    # "tmpfs" keeps every upper in memory (charged to nobody on the host disk);
    # a directory puts disk uppers there.
    upper_root: str = "/var/lib/camg/uppers"
    tmpfs_upper_bytes: int = 2 << 30
    # A deny-list checked after every lower is resolved: these directories
    # (AutoResearch's private answers) are never a lower, an upper or a
    # path the helper accepts, whatever the lower roots say.
    private_roots: tuple[str, ...] = ()
    # controller -> directory; empty means "derive" (see resolve_cgroup_parents).
    cgroup_parents: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    agent_uid: int = 2000
    agent_gid: int = 2000
    agent_user: str = "agent"
    agent_home: str = "/home/agent"
    # Lowers of the probe sandbox (bottom-first, under lower_roots): a real
    # Debian rootfs with bash, coreutils, mount and unshare. Empty means a
    # tree of the host's own binaries built into state_dir (proberoot.py).
    probe_lowers: tuple[str, ...] = ()
    probe_on_start: bool = True
    # The compiled per-sandbox init; empty means "build helper/sbxinit.c
    # into state_dir on start" (needs a C compiler on the host).
    init_binary: str = ""
    # Seconds a sandbox may take to come up before creation fails.
    create_timeout: float = 10.0
    ceilings: Ceilings = dataclasses.field(default_factory=Ceilings)
    # The container mediator (helper/containers.py); None: no Docker verbs.
    containers: ContainerConfig | None = None
    # Prometheus metrics (camg.metrics.HelperMetrics) on 127.0.0.1:<port>, a
    # listener of their own: the trainers' socket speaks only verbs. 0: none
    # (the default, so the tests' many helpers do not fight over one port;
    # units/helper.json turns it on).
    metrics_port: int = 0

    def __post_init__(self) -> None:
        for name in ("socket", "state_dir", "upper_root", "agent_home"):
            if not os.path.isabs(getattr(self, name)):
                raise ConfigError(f"{name}: must be an absolute path")
        if self.init_binary and not os.path.isabs(self.init_binary):
            raise ConfigError("init_binary: must be an absolute path")
        for root in self.lower_roots + self.probe_lowers:
            if not os.path.isabs(root):
                raise ConfigError(f"lower_roots: {root!r} is not absolute")
        for root in self.private_roots:
            if not os.path.isabs(root) or os.path.normpath(root) == "/":
                raise ConfigError(f"private_roots: {root!r} must be an absolute path below /")
        unknown = sorted(set(self.cgroup_parents) - set(CONTROLLERS))
        if unknown:
            raise ConfigError(f"cgroup_parents: unknown controller(s) {', '.join(unknown)}")
        for ctrl, path in self.cgroup_parents.items():
            if not os.path.isabs(path):
                raise ConfigError(f"cgroup_parents.{ctrl}: must be an absolute path")
        if not 0 < self.agent_uid < 65534 or not 0 < self.agent_gid < 65534:
            raise ConfigError("agent_uid/agent_gid: must be an unprivileged id")
        c = self.ceilings
        if (
            min(
                c.memory_bytes,
                c.pids_max,
                c.output_bytes,
                c.archive_bytes,
                c.sandboxes_per_peer,
                c.sandboxes_total,
                c.command_bytes,
                c.upper_bytes,
                c.lowers,
                c.connections,
                c.shm_bytes,
                c.shm_inodes,
            )
            <= 0
            or c.fork_depth < 0
            or c.warm_uppers < 0
            or c.cpu_quota <= 0
            or c.timeout <= 0
        ):
            raise ConfigError("ceilings: every ceiling must be positive")
        if self.create_timeout <= 0:
            raise ConfigError("create_timeout: must be positive")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port: must be a TCP port (1-65535) or 0 for none")
        if not 0 < self.tmpfs_upper_bytes <= c.upper_bytes:
            raise ConfigError("tmpfs_upper_bytes: must be positive and within ceilings.upper_bytes")


def load(path: str | None) -> HelperConfig:
    if path is None:
        return HelperConfig()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read helper config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"helper config {path} is not JSON: {exc}") from None
    config = parse(HelperConfig, data, "helper", ConfigError)
    check_private_roots(config)
    return config


def check_private_roots(config: HelperConfig) -> None:
    """Probe the deny-list at start: the helper refuses to start while a
    private root is reachable as a lower or overlaps what it writes."""
    from helper import paths

    try:
        paths.probe_private_roots(
            config.lower_roots,
            config.private_roots,
            (config.upper_root, config.state_dir, config.socket) + config.probe_lowers,
        )
    except (ValueError, OSError) as exc:
        raise ConfigError(f"private_roots: {exc}") from None


def resolve_cgroup_parents(
    config: HelperConfig, proc_cgroup: str = "/proc/self/cgroup", mount_root: str = "/sys/fs/cgroup"
) -> dict[str, str]:
    """Directory per controller under which sandbox cgroups are created.

    Configured values win. Under systemd with Delegate=yes the helper owns its
    own cgroup, so sandboxes go below it; otherwise /sys/fs/cgroup/<ctrl>/camg.
    """
    own: dict[str, str] = {}
    under_systemd = bool(os.environ.get("INVOCATION_ID"))
    if under_systemd:
        with open(proc_cgroup, encoding="ascii") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for ctrl in ctrls.split(","):
                    own[ctrl] = path
    parents = {}
    for ctrl in CONTROLLERS:
        if ctrl in config.cgroup_parents:
            parents[ctrl] = config.cgroup_parents[ctrl]
        elif ctrl in own and own[ctrl] not in ("", "/"):
            # A delegated cgroup may hold processes itself; v1 allows that.
            parents[ctrl] = os.path.join(mount_root, ctrl, own[ctrl].lstrip("/"))
        else:
            parents[ctrl] = os.path.join(mount_root, ctrl, "camg")
    return parents
