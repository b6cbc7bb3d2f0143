"""The helper's configuration of the container mediator (key ``containers``).

Absent, the container verbs answer ``docker_unavailable``: a helper serving
only sandboxes (Coding, AutoResearch) needs no Docker. Stdlib only, like
helper/config.py, so a configuration can be checked without the docker SDK.
"""

from __future__ import annotations

import dataclasses
import os
import re

SCOPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


class ContainerConfigError(ValueError):
    """Raised by __post_init__; camg.typed.parse reports it under the field."""


@dataclasses.dataclass(frozen=True)
class ContainerConfig:
    docker_socket: str = "/var/run/docker.sock"
    # JSON {"images": ["REGISTRY/REPO@sha256:HEX", ...]}: the only images a
    # peer may run (re-read when its mtime changes).
    images_manifest: str = "/etc/camg/container-images.json"
    # Every container carries camg.helper=<scope>; a start-up sweep and
    # --sweep remove exactly that scope's containers (tests use their own).
    scope: str = "system"
    # The one host path a container may see: a Python environment for the
    # agent/tool bridge (mimo.agent_environment), mounted read-only.
    agent_env_source: str = ""
    agent_env_target: str = "/opt/camg/agent-env"
    max_cpu: float = 4.0
    max_memory_bytes: int = 8 << 30
    max_pids: int = 4096
    containers_per_peer: int = 256
    containers_total: int = 512
    # Every container's writable layer on its own ext4 of this many bytes
    # and inodes (helper/container_disk.py), its sparse image under
    # upper_root on the host's disk.
    upper_root: str = "/var/lib/camg/container-uppers"
    upper_bytes: int = 4 << 30
    upper_inodes: int = 1 << 18
    # Every container's /dev/shm: a tmpfs of this many bytes and inodes
    # in place of Docker's (which has size= only, so a tmpfs's default
    # nr_inodes, half the host's RAM pages); its pages are charged to the
    # container's memory cgroup.
    shm_bytes: int = 64 << 20
    shm_inodes: int = 4096
    # Seconds any one Docker API call may take (pull excepted).
    api_timeout: float = 60.0
    pull_timeout: float = 900.0
    # Containers being created or started at once (helper/container_gate.py);
    # more wait in arrival order. dockerd slows down for every create/start
    # in flight: 256 at once took some single calls past api_timeout (53 of
    # 256 failed at 60 s). A fixed 8, not one per core: most of a start is
    # waiting on dockerd, containerd, runc and the layer's mkfs.ext4, and
    # dockerd serialises much of it whatever the host's size.
    concurrent_starts: int = 8
    # Seconds a create may wait for one of those slots, then at_capacity
    # (not counted against api_timeout: no Docker call is made meanwhile).
    # ContainerCreate and ContainerFork carry no deadline of the caller's:
    # this is a backstop for a queue that stopped moving, twice the
    # services' default reset_timeout_s (camg/config/service_config.py) so a burst
    # their own deadlines allow is never refused by it.
    start_wait_timeout: float = 600.0

    def __post_init__(self) -> None:
        for name in ("docker_socket", "images_manifest", "agent_env_target", "upper_root"):
            if not os.path.isabs(getattr(self, name)):
                raise ContainerConfigError(f"containers.{name}: must be an absolute path")
        if self.agent_env_source and not os.path.isabs(self.agent_env_source):
            raise ContainerConfigError("containers.agent_env_source: must be an absolute path")
        if not SCOPE.match(self.scope):
            raise ContainerConfigError(
                "containers.scope: 1-40 of [A-Za-z0-9_.-], not starting with . _ -"
            )
        if (
            min(
                self.max_cpu,
                self.max_memory_bytes,
                self.max_pids,
                self.containers_per_peer,
                self.containers_total,
                self.api_timeout,
                self.pull_timeout,
                self.shm_bytes,
                self.shm_inodes,
                self.start_wait_timeout,
            )
            <= 0
        ):
            raise ContainerConfigError("containers: every ceiling and timeout must be positive")
        if (
            isinstance(self.concurrent_starts, bool)
            or not isinstance(self.concurrent_starts, int)
            or self.concurrent_starts < 1
        ):
            raise ContainerConfigError("containers.concurrent_starts: a positive integer")
        # ext4 needs a few MiB of metadata and a few inodes of its own.
        if self.upper_bytes < 16 << 20 or self.upper_inodes < 1024:
            raise ContainerConfigError(
                "containers: upper_bytes must be at least 16 MiB and upper_inodes at least 1024"
            )
