"""Cached Debian bookworm root filesystems for the system tests.

Two layers, each cached under $CAMG_CACHE/system and built atomically (into
a temporary directory renamed into place, so an interrupted build is never
mistaken for a finished one):

* base: debootstrap minbase with systemd, dbus and python3; changes only
  when BASE_PACKAGES changes.
* deps: base plus every Debian package the project's packaging/apt/*.txt
  fragments name, keyed by the hash of that list, so install.sh finds its
  apt step already done and the test stays offline for apt.

A test run copies the deps layer (plain ``cp -a``: an overlay root would
make the helper's overlay uppers nest on overlayfs, which the kernel
refuses) and installs the project into the copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from systest_cgroup import OwnCgroup

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the base layer must hold to boot and to run packaging/install.sh.
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv",
                 "git", "ca-certificates", "curl", "iproute2", "procps")


def cache_root() -> Path:
    root = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test")) / "system"
    root.mkdir(parents=True, exist_ok=True)
    return root


def apt_fragment_packages(checkout: Path) -> list[str]:
    """Package names from packaging/apt/*.txt (comments and blanks dropped)."""
    names: set[str] = set()
    for fragment in sorted((checkout / "packaging" / "apt").glob("*.txt")):
        for line in fragment.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.add(line)
    return sorted(names)


def _key(packages: list[str] | tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()[:16]


def run_logged(argv: list[str], log: Path, timeout: float) -> None:
    """Run (an nspawn in a cgroup of its own), output to log; raise on failure."""
    cgroup = OwnCgroup().create()
    try:
        with open(log, "ab") as out:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False,
                                  preexec_fn=cgroup.preexec)
    finally:
        stuck = cgroup.remove()
    if stuck:
        raise RuntimeError(f"{argv[0]} left cgroups behind: {stuck}")
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}); log {log}:\n{tail}")


def _build_atomically(final: Path, build) -> Path:
    if final.is_dir():
        return final
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        # A previous build was interrupted; nothing else uses a .tmp tree.
        shutil.rmtree(tmp)
    build(tmp)
    tmp.rename(final)
    return final


def prune_siblings(keep: Path, prefix: str) -> None:
    """Remove older cache entries of one kind (e.g. deps-*), keeping ``keep``.

    Only finished entries: a .tmp may be another run's build in progress.
    """
    for entry in keep.parent.glob(prefix + "*"):
        if entry != keep and entry.is_dir() and not entry.name.endswith(".tmp"):
            shutil.rmtree(entry, ignore_errors=True)


def nspawn_pipe(root: Path, command: list[str], *, binds: list[str] = (),
                env: dict[str, str] | None = None) -> list[str]:
    """argv that runs one command in ``root`` without booting it.

    Shares the host network (apt and pip need the package registries); a
    booted machine gets a private network instead.
    """
    argv = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--pipe",
            "-D", str(root), "--machine=camg-systest-pipe",
            "--setenv=DEBIAN_FRONTEND=noninteractive", "--setenv=LC_ALL=C.UTF-8"]
    for key, value in (env or {}).items():
        argv.append(f"--setenv={key}={value}")
    # "SRC:DST:ro" binds read-only.
    argv += [f"--bind-ro={b[:-3]}" if b.endswith(":ro") else f"--bind={b}" for b in binds]
    return argv + ["--"] + command


def base_rootfs() -> Path:
    cache = cache_root()
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)

    def build(tmp: Path) -> None:
        run_logged(["debootstrap", "--variant=minbase", f"--cache-dir={debs}",
              "--include=" + ",".join(BASE_PACKAGES), SUITE, str(tmp), MIRROR],
             cache / "debootstrap.log", timeout=900)

    return _build_atomically(cache / f"base-{SUITE}-{_key(BASE_PACKAGES)}", build)


def deps_rootfs(checkout: Path) -> Path:
    packages = apt_fragment_packages(checkout)
    base = base_rootfs()
    cache = cache_root()

    def build(tmp: Path) -> None:
        run_logged(["cp", "-a", str(base), str(tmp)], cache / "deps.log", timeout=600)
        script = ("apt-get update -q && apt-get install -y -q --no-install-recommends "
                  + " ".join(packages))
        # No apt-get clean: the archive is the bound host cache, kept for rebuilds.
        run_logged(nspawn_pipe(tmp, ["/bin/sh", "-ec", script],
                         binds=[f"{cache / 'debs'}:/var/cache/apt/archives"]),
             cache / "deps.log", timeout=1500)

    final = _build_atomically(cache / f"deps-{SUITE}-{_key(list(BASE_PACKAGES) + packages)}", build)
    prune_siblings(final, f"deps-{SUITE}-")
    return final


def fresh_copy(template: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run(["cp", "-a", str(template), str(dest)], check=True, timeout=600)
    return dest
