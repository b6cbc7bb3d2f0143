"""A Docker engine of the guest's own, inside a systemd-nspawn machine.

What it takes (measured here, systemd 252, docker.io 20.10, cgroup v1
hybrid; /work/notes/docker-in-nspawn.md has the failures behind each):

* nspawn mounts the guest's cgroup-v1 controllers read-only, and runc
  mkdirs and writes /sys/fs/cgroup/<controller>/docker/<id>. nspawn mounts
  the cgroup hierarchies after its --bind= mounts (inside the cgroup
  namespace), so binding straight onto /sys/fs/cgroup/<controller> is
  overmounted. Instead the machine gets a host cgroup directory of its own
  per controller at /run/hostcg-docker/<controller>, and a guest unit that
  runs before containerd and dockerd replaces each read-only mount with it
  (umount, then bind; in the guest's own mount namespace). Not stacked on
  top: runc reads the first mountinfo entry of a mount point, and with the
  read-only one still below it takes that one's root and looks for the
  container's cgroup at a path that does not exist.
* The directories are created below the cgroup the test runs in (per
  controller), i.e. at the root of the guest's cgroup namespace, so the
  paths the guest sees in /proc/self/cgroup and the bind's root agree.
* nspawn's seccomp filter denies keyctl(2) with EPERM; runc joins a
  session keyring for every container and fails ("unable to join session
  keyring"): --system-call-filter=@keyring gives it back.
* overlay2 needs a non-overlay /var/lib/docker: the guest's root is a plain
  directory copy on the host's ext4, so that holds as is.
* The guest's dockerd gets no bridge and touches no iptables: every camg
  container runs with network none, and an installer machine shares the
  host's network namespace.

The host's /var/run/docker.sock is never bound in: the guest's engine is
its own (its socket /run/docker.sock, its images, its containers).
"""

from __future__ import annotations

import json
from pathlib import Path

from systest_cgroup import CGROOT

# The host's cgroup-v1 controllers runc joins (every one it finds mounted).
DOCKER_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")
GUEST_HOSTCG = "/run/hostcg-docker"
# Not camg-*: tests list and stop camg-* units; this one stays active.
SETUP_UNIT = "systest-docker-cgroups.service"

# Runs before containerd and dockerd: the writable controllers over the
# read-only ones nspawn mounted. Only in a machine booted with docker=True
# (the condition), so the same root boots unchanged otherwise.
_UNIT = f"""[Unit]
Description=camg system tests: writable cgroup-v1 controllers for the guest's dockerd
DefaultDependencies=no
ConditionPathIsDirectory={GUEST_HOSTCG}
Before=containerd.service docker.service docker.socket
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -ec 'for c in {" ".join(DOCKER_CONTROLLERS)}; do \\
    mountpoint -q /sys/fs/cgroup/$c || continue; \
    umount /sys/fs/cgroup/$c; mount --bind {GUEST_HOSTCG}/$c /sys/fs/cgroup/$c; done'

[Install]
WantedBy=sysinit.target
"""

# No bridge, no iptables, no userland proxy: camg's containers have no
# network, and a machine without --private-network shares the host's.
DAEMON_JSON = {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False,
               "userland-proxy": False, "log-driver": "json-file"}


def prepare_cgroups(dirs: dict[str, Path]) -> None:
    for controller, path in dirs.items():
        path.mkdir()
        if controller == "cpuset":
            # A new cpuset has no cpus or mems, and runc copies them from
            # the parent only up to its mount point: this directory.
            for name in ("cpuset.cpus", "cpuset.mems"):
                (path / name).write_text((path.parent / name).read_text())


def nspawn_args(dirs: dict[str, Path]) -> list[str]:
    return ["--system-call-filter=@keyring",
            *(f"--bind={p}:{GUEST_HOSTCG}/{c}" for c, p in dirs.items())]


def prepare_root(root: Path) -> None:
    """Install the cgroup unit and the daemon settings into a guest root
    (idempotent; harmless in a machine booted without docker=True)."""
    units = root / "etc/systemd/system"
    (units / SETUP_UNIT).write_text(_UNIT)
    wants = units / "sysinit.target.wants"
    wants.mkdir(exist_ok=True)
    link = wants / SETUP_UNIT
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{SETUP_UNIT}")
    daemon = root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True, exist_ok=True)
    daemon.write_text(json.dumps(DAEMON_JSON, indent=1) + "\n")


def labelled(machine, kind: str, label: str) -> list[str]:
    """Names/ids of the guest's containers, networks or volumes with a label."""
    argv = {"container": ["docker", "ps", "-aq"], "network": ["docker", "network", "ls", "-q"],
            "volume": ["docker", "volume", "ls", "-q"]}[kind]
    out = machine.run([*argv, "--filter", f"label={label}"]).stdout
    return out.split()


def docker_cgroup_dirs(name: str) -> dict[str, Path]:
    """Per controller: ``name`` below this process's own cgroup (where the
    guest's cgroup namespace will be rooted)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            own[controller] = path
    return {c: CGROOT / c / own.get(c, "/").lstrip("/") / name for c in DOCKER_CONTROLLERS}
