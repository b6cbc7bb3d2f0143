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
#: every temporary directory of a run starts with this (its pid: a
#: parallel run's are told apart, tests/privileged/test_reliability_suites.py)
TMP_PREFIX = f"camg-rel-{os.getpid()}-"


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
                 probes: bool = True, extra: dict | None = None) -> None:
        """``extra``: more helper.json (private_roots, a ``containers``
        section whose scope, if any, the container census then counts)."""
        tag = f"camg-rel-{os.getpid()}"
        self.base = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
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
            **(extra or {}),
        }
        self.scope = (self.cfg.get("containers") or {}).get("scope")
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
            "containers": containers(self.scope),
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


def scope(name: str) -> str:
    """The container scope of a helper of this run (``camg.helper`` label);
    tagged with our pid like the privileged tests' scopes, so their leak
    checks and sweeps leave it to us."""
    return f"rel-{os.getpid()}-{name}"


def containers(scope: str | None = None) -> int:
    """Docker containers, running or not, labelled by this run's helpers
    (``camg.helper=<scope>``, or ``scope`` only); 0 without Docker."""
    if not shutil.which("docker") or not os.path.exists("/var/run/docker.sock"):
        return 0
    wanted = f"label=camg.helper={scope}" if scope else "label=camg.helper"
    out = subprocess.run(["docker", "ps", "-a", "--filter", wanted, "--format",
                          '{{.ID}} {{.Label "camg.helper"}}'],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return 0
    mine = scope or f"rel-{os.getpid()}-"
    return sum(1 for line in out.stdout.splitlines()
               if line.split()[1:] and line.split()[1].startswith(mine))


def container_memory(scope: str) -> tuple[int, int]:
    """(containers of ``scope``, their memory cgroups' usage in bytes, page
    cache included), read on the host (dockerd's cgroupfs driver)."""
    out = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter",
                          f"label=camg.helper={scope}"], capture_output=True, text=True, timeout=60)
    ids = out.stdout.split() if out.returncode == 0 else []
    total = 0
    for cid in ids:
        for base in (Path("/sys/fs/cgroup/memory/docker") / cid, Path("/sys/fs/cgroup/docker") / cid):
            for name in ("memory.usage_in_bytes", "memory.current"):
                try:
                    total += int((base / name).read_text())
                    break
                except (OSError, ValueError):
                    continue
            else:
                continue
            break
    return len(ids), total


def state_strays(state_dir: Path, episode_ids: set[str], files: tuple[str, ...] = (),
                 dirs: tuple[str, ...] = (), records: list[dict] = ()) -> list[str]:
    """Files of a service's state directory beyond its records: outcomes.jsonl,
    one trajectory per episode and the submissions the records name
    (``submissions/<aa>/<sha256>``, camg/submissions.py); ``files`` the
    environment keeps (e.g. AutoResearch's clean.json), ``dirs`` whose files
    must each be named for an episode of the run (Visual's screenshots)."""
    named = {(r.get("submission") or {}).get("sha256") for r in records}
    strays = []
    for entry in sorted(os.listdir(state_dir)) if state_dir.exists() else []:
        if entry == "outcomes.jsonl" or entry in files:
            continue
        if entry == "trajectories" or entry in dirs:
            for name in sorted(os.listdir(state_dir / entry)):
                if name.split(".")[0] not in episode_ids:
                    strays.append(f"{entry}/{name}")
            continue
        if entry == "submissions":
            for sub in sorted(os.listdir(state_dir / entry)):
                for name in sorted(os.listdir(state_dir / entry / sub)):
                    if f"sha256:{name}" not in named:
                        strays.append(f"{entry}/{sub}/{name}")
            continue
        strays.append(entry)
    return strays
