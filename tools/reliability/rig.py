"""The rig every suite runs on: a private camg-helper and the census of what
it (and a service's state directory) holds.

The helper has its own socket, state directory, upper root and cgroup
parents, tagged with this process's pid (the privileged tests' leak check
then knows they are someone else's), so a census counts only what this run
made: ledger entries, uppers, sandbox cgroups, processes in them, sandbox
inits, host mounts naming the rig, Docker containers carrying its label.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from camg.helper_client import HelperClient

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
CONTROLLERS = ("cpu", "memory", "pids", "freezer")
#: label every container this run could create carries (General/Visual)
LABEL = "io.camg.reliability"


def minbase() -> Path:
    """The Debian minbase rootfs the privileged tests build (debootstrap, cached)."""
    path = CACHE / "helper" / "bookworm-minbase"
    if not (path / "bin" / "bash").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"bookworm-minbase.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(tmp),
                        "http://deb.debian.org/debian"], check=True, capture_output=True)
        tmp.rename(path)
    return path


class Helper:
    """A camg-helper process of this run, removed completely by ``stop()``."""

    def __init__(self, lower_roots: list[str], *, ceilings: dict | None = None,
                 probes: bool = True) -> None:
        tag = f"camg-rel-{os.getpid()}"
        self.base = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
        # The sandbox's uid must reach the socket's directory, no more.
        self.base.chmod(0o711)
        self.cfg = {
            "socket": str(self.base / "helper.sock"), "state_dir": str(self.base / "state"),
            "group": "nogroup", "lower_roots": lower_roots,
            "upper_root": str(self.base / "uppers"), "probe_lowers": [str(minbase())],
            "probe_on_start": probes,
            "cgroup_parents": {c: f"/sys/fs/cgroup/{c}/{tag}-{self.base.name}"
                               for c in CONTROLLERS},
            "ceilings": ceilings or {},
        }
        (self.base / "uppers").mkdir()
        (self.base / "helper.json").write_text(json.dumps(self.cfg))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "helper", "--config", str(self.base / "helper.json")],
            cwd=ROOT, env=env, start_new_session=True,
            stderr=open(self.base / "helper.log", "wb"))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if HelperClient(self.socket).ping()["probes_ok"]:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.1)
        log = self.log()
        self.stop()
        raise RuntimeError("the rig's helper never became ready:\n" + log[-3000:])

    @property
    def socket(self) -> str:
        return self.cfg["socket"]

    def log(self) -> str:
        return (self.base / "helper.log").read_text(errors="replace")

    def client(self, owner: str = "reliability", pool_size: int = 8) -> HelperClient:
        return HelperClient(self.socket, owner=owner, pool_size=pool_size)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        return rss_kib(self.proc.pid)

    def census(self) -> dict[str, int]:
        """What the helper holds now (all zero when nothing leaked)."""
        state = Path(self.cfg["state_dir"])
        cgroups, procs = 0, 0
        for parent in self.cfg["cgroup_parents"].values():
            try:
                names = [n for n in os.listdir(parent) if os.path.isdir(os.path.join(parent, n))]
            except FileNotFoundError:
                continue
            cgroups += len(names)
            for name in names:
                try:
                    procs += len(Path(parent, name, "cgroup.procs").read_text().split())
                except OSError:
                    pass  # removed while we looked
        with open("/proc/self/mountinfo") as f:
            mounts = sum(1 for line in f if str(self.base) in line)
        return {
            "ledger": _count(state / "ledger"),
            "uppers": _count(Path(self.cfg["upper_root"])),
            "cgroups": cgroups,
            "processes": procs + len(children(self.proc.pid)),
            "mounts": mounts,
            "containers": containers(),
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for path in self.cfg["cgroup_parents"].values():
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass  # already gone (the helper removes the parents it made)
        shutil.rmtree(self.base, ignore_errors=True)


def _count(path: Path) -> int:
    try:
        return len(os.listdir(path))
    except FileNotFoundError:
        return 0


def children(pid: int) -> set[int]:
    kids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        kids.add(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # exited while we looked
    return kids


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def containers() -> int:
    """Docker containers carrying this run's label (0 without Docker)."""
    if not shutil.which("docker") or not os.path.exists("/var/run/docker.sock"):
        return 0
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}={os.getpid()}"],
                         capture_output=True, text=True, timeout=60)
    return len(out.stdout.split()) if out.returncode == 0 else 0


def state_strays(state_dir: Path, episode_ids: set[str]) -> list[str]:
    """Files of a service's state directory beyond its records: outcomes.jsonl
    and one trajectory per episode."""
    strays = []
    for entry in sorted(os.listdir(state_dir)) if state_dir.exists() else []:
        if entry == "outcomes.jsonl":
            continue
        if entry == "trajectories":
            for name in sorted(os.listdir(state_dir / entry)):
                if name.removesuffix(".jsonl") not in episode_ids:
                    strays.append(f"trajectories/{name}")
            continue
        strays.append(entry)
    return strays
