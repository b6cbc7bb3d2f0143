"""What the system tests' guests share: where things go in a guest, what a
guest borrows from the host, the pip settings of an install in a guest."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import systest_rootfs as rootfs

CHECKOUT = Path(__file__).resolve().parents[2]
# Inside the machine: where the test puts the operator's checkout, and the
# helper config that points cgroup parents at the bound host controllers.
GUEST_CHECKOUT = "/root/camg-checkout"
GUEST_HELPER_CONFIG = "/root/helper-systest.json"
# The shared machine of the unit/kill-storm tests serves the environments
# those tests drive (Coding and Shop: no Docker engine, no heavy research
# image); the newcomer test runs demo.sh's default (every environment with
# demo data). On the guest's own Debian python3, the interpreter
# packaging/lib.sh camg_python picks on bookworm.
INSTALL_FLAGS: list[str] = ["--environments", "coding,shop"]
GUEST_PIP_CACHE = "/var/cache/camg-pip"
GUEST_PYTHON = "/usr/bin/python3"
_HOST_INDEXES = ("/opt/pypi", "/opt/pypi-more", "/opt/wheels")
GUEST_VENV = "/srv/camg/service-venv"


def venv_cache() -> Path:
    """A warm service venv, keyed by the pinned requirements and the guest
    root it was made in (its python3).

    install.sh still runs every pip step against it; a warm venv only turns
    them into "already satisfied". Bound at the venv's own path, because a
    venv is not relocatable.
    """
    pins = sorted(CHECKOUT.glob("requirements/*.in")) + sorted(CHECKOUT.glob("requirements.lock"))
    guest = rootfs.deps_rootfs(CHECKOUT).name.encode()
    key = hashlib.sha256(GUEST_PYTHON.encode() + guest
                         + b"".join(p.read_bytes() for p in pins)).hexdigest()[:16]
    path = rootfs.cache_root() / f"venv-{key}"
    path.mkdir(exist_ok=True)
    rootfs.prune_siblings(path, "venv-")
    return path


def host_binds() -> list[str]:
    """What the guest borrows from the host, read-only, at the same paths
    (never an interpreter: the guest runs its own Debian python3).

    * the CA bundle: registries are reached through an egress proxy whose CA
      only the host's bundle carries;
    * the on-disk package indexes this machine's pip is configured with
      (e.g. the CPU torch build the lock pins lies only there).
    """
    paths = [Path("/etc/ssl/certs/ca-certificates.crt")] + [Path(p) for p in _HOST_INDEXES]
    return [f"{p}:{p}:ro" for p in paths if p.exists()]


def host_pip_env() -> dict[str, str]:
    # TMPDIR on disk: the guest's /tmp is a small tmpfs and wheels are big.
    env = {"PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_CACHE_DIR": GUEST_PIP_CACHE, "TMPDIR": "/var/tmp"}
    indexes = [p for p in _HOST_INDEXES if Path(p, "simple").is_dir()]
    if indexes:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(f"file://{p}/simple" for p in indexes)
    if Path("/opt/wheels").is_dir():
        env["PIP_FIND_LINKS"] = "/opt/wheels"
    if "PIP_DEFAULT_TIMEOUT" in os.environ:
        env["PIP_DEFAULT_TIMEOUT"] = os.environ["PIP_DEFAULT_TIMEOUT"]
    return env


def guest_root(name: str) -> Path:
    """A fresh copy of the cached Debian root holding the operator's checkout
    (a clone of what is committed here, as a fresh CI clone would be) and
    the helper config whose cgroup parents are the bound host controllers."""
    from systest_machine import Machine

    template = rootfs.deps_rootfs(CHECKOUT)
    run_dir = rootfs.cache_root() / "runs"
    run_dir.mkdir(exist_ok=True)
    root = rootfs.fresh_copy(template, run_dir / f"{name}-{os.getpid()}")
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(CHECKOUT),
                    str(root / GUEST_CHECKOUT.lstrip("/"))], check=True, timeout=300)
    base = json.loads((CHECKOUT / "units" / "helper.json").read_text())
    (root / GUEST_HELPER_CONFIG.lstrip("/")).write_text(
        json.dumps(Machine.helper_config_for_guest(base), indent=1))
    # The root's docker.service starts at every boot: on an installer's host
    # network it must make no bridge or iptables rules there.
    from systest_docker import prepare_root
    prepare_root(root)
    return root
