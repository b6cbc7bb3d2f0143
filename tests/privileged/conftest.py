"""Privileged tests: root, real kernel features, and a leak check on every test.

The autouse ``leak_check`` fixture snapshots, before each test, the mounts of
this mount namespace, the cgroup directories below every camg* cgroup parent,
this process's children and the entries of every registered state root, and
fails the test if anything new is still there afterwards (after a short
settle). Session fixtures that own long-lived things (a helper process, a
docker daemon) register them with ``allow_process``/``allow_mounts_under``
so starting them inside a test is not reported; directories they keep are
reported only if registered with ``state_root`` and left non-empty.

Also here: the cached Debian rootfs (debootstrap, under $CAMG_CACHE) and a
session-wide camg-helper on its own socket, state dir and cgroup parents.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
CONTROLLERS = ("cpu", "memory", "pids", "freezer")
CGROUP_ROOT = Path("/sys/fs/cgroup")

_TAGGED = re.compile(r"-(\d+)(?=-|$)")
_allowed_pids: set[int] = set()
_allowed_mount_prefixes: list[str] = []
_state_roots: list[Path] = []


def allow_process(pid: int) -> None:
    _allowed_pids.add(pid)


def allow_mounts_under(prefix: str) -> None:
    _allowed_mount_prefixes.append(prefix.rstrip("/") + "/")


def state_root(path: Path) -> Path:
    """Register a directory whose new entries count as leaks."""
    _state_roots.append(Path(path))
    return Path(path)


def pytest_configure(config):
    config.addinivalue_line("markers", "leaks_allowed: skip the privileged leak check (explain why)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.privileged)


@pytest.fixture(scope="session", autouse=True)
def _require_root():
    if os.geteuid() != 0:
        pytest.skip("privileged tests need root (CI runs them as root)")


# -- the leak check ----------------------------------------------------------

def _mounts() -> dict[str, str]:
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            out[fields[0]] = fields[4]
    return out


def _foreign(name: str) -> bool:
    """Tagged with another live process's pid: that run's business."""
    tag = _TAGGED.search(name)
    return bool(tag) and int(tag.group(1)) != os.getpid() and os.path.exists(f"/proc/{tag.group(1)}")


def _cgroups() -> set[str]:
    found = set()
    for ctrl in CONTROLLERS:
        base = CGROUP_ROOT / ctrl
        try:
            tops = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("camg")]
        except FileNotFoundError:
            continue
        for top in tops:
            # Trees tagged with another live process's pid (camg-test-PID-…,
            # camg-bench-…-PID) are that run's business: engineers share
            # this machine; CI runs alone.
            if _foreign(top.name):
                continue
            for dirpath, dirnames, _ in os.walk(top):
                for d in dirnames:
                    found.add(os.path.join(dirpath, d))
    return found


def _children(pid: int) -> set[int]:
    return _children_of({pid})


def _children_of(parents: set[int]) -> set[int]:
    """Children of any of ``parents``, from each thread's children list
    (a child is listed by the thread that forked it): a few small reads,
    where a pass over all of /proc took ~20 ms on a loaded machine (the leak
    check runs twice per test)."""
    kids = set()
    for parent in parents:
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue  # exited: no children of its own any more
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids.update(int(p) for p in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                pass  # the thread exited between the listing and the read
    return kids


def _state_entries() -> set[str]:
    out = set()
    for root in _state_roots:
        try:
            out.update(str(root / name) for name in os.listdir(root))
        except FileNotFoundError:
            pass
    return out


_docker_api = None


def _containers() -> set[str]:
    """Docker containers of this suite (label camg.helper = a helper's scope).

    Scopes tagged with another live process's pid (test-PID-…) belong to a
    parallel run and are ignored, like its cgroups.
    """
    global _docker_api
    if not os.path.exists("/var/run/docker.sock"):
        return set()
    try:
        if _docker_api is None:
            import docker
            _docker_api = docker.APIClient(base_url="unix:///var/run/docker.sock", timeout=30)
        found = _docker_api.containers(all=True, filters={"label": ["camg.helper"]})
    except Exception:  # noqa: BLE001  no dockerd: no container can have leaked
        return set()
    return {f"{c['Id'][:12]} ({c['Labels'].get('camg.helper')}, {c['Names'][0] if c['Names'] else ''})"
            for c in found if not _foreign(c["Labels"].get("camg.helper", ""))}


def _snapshot() -> dict:
    watched = {os.getpid()} | _allowed_pids
    return {"mounts": _mounts(), "cgroups": _cgroups(),
            "procs": _children_of(watched), "state": _state_entries(),
            "containers": _containers()}


def _leaks(before: dict) -> list[str]:
    now = _snapshot()
    leaks = []
    for mid, point in now["mounts"].items():
        if mid in before["mounts"] or any((point + "/").startswith(p) for p in _allowed_mount_prefixes):
            continue
        if any(_foreign(part) for part in point.split("/") if part.startswith("camg")):
            continue
        leaks.append(f"mount {point}")
    leaks += [f"cgroup {c}" for c in sorted(now["cgroups"] - before["cgroups"])]
    leaks += [f"process {p}" for p in sorted(now["procs"] - before["procs"] - _allowed_pids)]
    leaks += [f"state entry {s}" for s in sorted(now["state"] - before["state"])]
    leaks += [f"container {c}" for c in sorted(now["containers"] - before["containers"])]
    return leaks


@pytest.fixture(autouse=True)
def leak_check(request):
    if request.node.get_closest_marker("leaks_allowed"):
        yield
        return
    before = _snapshot()
    yield
    deadline = time.monotonic() + 5
    leaks = _leaks(before)
    while leaks and time.monotonic() < deadline:
        time.sleep(0.1)
        leaks = _leaks(before)
    if leaks:
        pytest.fail("left behind: " + "; ".join(leaks[:20]), pytrace=False)


# -- a real Debian rootfs -----------------------------------------------------

@pytest.fixture(scope="session")
def lower_root() -> Path:
    """The directory under which every helper test's lowers live."""
    path = CACHE / "helper"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def rootfs(lower_root: Path) -> Path:
    """debootstrap --variant=minbase bookworm, built once and cached."""
    target = lower_root / "bookworm-minbase"
    with open(lower_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "bin" / "bash").exists():
            tmp = lower_root / f"bookworm-minbase.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(tmp),
                            "http://deb.debian.org/debian"], check=True, capture_output=True)
            tmp.rename(target)
    return target


# -- a session helper ------------------------------------------------------------

class HelperProcess:
    def __init__(self, base: Path, config: dict, proc: subprocess.Popen) -> None:
        self.base = base
        self.config = config
        self.proc = proc
        self.socket = config["socket"]

    def client(self, owner: str = "test"):
        from camg.helper_client import HelperClient
        return HelperClient(self.socket, owner=owner)

    def sandbox_inits(self) -> set[int]:
        return _children(self.proc.pid)


def helper_config(base: Path, lower_root: Path, rootfs: Path, **extra) -> dict:
    tag = f"camg-test-{os.getpid()}-{base.name}"
    cfg = {
        "socket": str(base / "helper.sock"),
        "state_dir": str(base / "state"),
        "group": "nogroup",
        "lower_roots": [str(lower_root)],
        "upper_root": str(base / "uppers"),
        "probe_lowers": [str(rootfs)],
        "cgroup_parents": {c: str(CGROUP_ROOT / c / tag) for c in CONTROLLERS},
    }
    cfg.update(extra)
    return cfg


def start_helper(base: Path, cfg: dict, *, wait_probes: bool = True, args=()) -> HelperProcess:
    base.mkdir(parents=True, exist_ok=True)
    (base / "uppers").mkdir(exist_ok=True)
    path = base / "helper.json"
    path.write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "helper", "--config", str(path), *args],
                            cwd=ROOT, env=env, stderr=open(base / "helper.log", "ab"),
                            start_new_session=True)
    allow_process(proc.pid)
    helper = HelperProcess(base, cfg, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"helper exited: {(base / 'helper.log').read_text()[-2000:]}")
        if os.path.exists(cfg["socket"]):
            try:
                info = helper.client().ping()
                if info["probes_ok"] or not wait_probes:
                    return helper
            except Exception:
                pass
        time.sleep(0.05)
    stop_helper(helper)
    raise RuntimeError(f"helper never became ready: {(base / 'helper.log').read_text()[-2000:]}")


def stop_helper(helper: HelperProcess) -> None:
    if helper.proc.poll() is None:
        helper.proc.send_signal(signal.SIGTERM)
        try:
            helper.proc.wait(30)
        except subprocess.TimeoutExpired:
            helper.proc.kill()
            helper.proc.wait()
    _allowed_pids.discard(helper.proc.pid)
    remove_parents(helper.config)


def remove_parents(cfg: dict) -> None:
    for path in cfg["cgroup_parents"].values():
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass  # already gone


@pytest.fixture(scope="session")
def helper(lower_root, rootfs):
    # Not under pytest's basetemp: peer-credential tests connect as other
    # uids, so the socket's directories must be traversable (pytest keeps
    # its root 0700); the socket's own mode and group then decide.
    base = Path(tempfile.mkdtemp(prefix="camg-helper-test-"))
    base.chmod(0o711)
    cfg = helper_config(base, lower_root, rootfs)
    proc = start_helper(base, cfg)
    state_root(base / "state" / "ledger")
    state_root(base / "uppers")
    state_root(base / "state" / "mnt")
    yield proc
    stop_helper(proc)
    _state_roots[:] = [r for r in _state_roots if base not in r.parents]
    shutil.rmtree(base)


@pytest.fixture
def client(helper):
    c = helper.client(owner=f"t{os.getpid()}")
    yield c
    assert helper.proc.poll() is None, "the helper died during the test"
    # A test that forgot a sandbox fails; either way the next one starts clean.
    left = c.list_sandboxes()
    c.release_all()
    c.close()
    assert left == [], f"the test left sandboxes behind: {left}"


@pytest.fixture
def sandbox(client, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=256 << 20, cpu_quota=1.0, pids_max=256)
    yield sid
    client.destroy(sid)
