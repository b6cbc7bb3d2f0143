"""A camg-helper of this process: its own socket, state directory, upper
root and cgroup parents, tagged with our pid (``camg-NAME-PID-…``) so a
parallel run's leak checks know they are someone else's, and removed
completely by ``stop()``.

    helper = start_private("bench-x", [str(lower)], [str(minbase())])
    ...
    helper.stop()

The privileged tests build their config with ``helper_config`` and start it
with ``HelperProcess.start`` in a directory of their own.
"""

from __future__ import annotations

import fcntl
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
from camg.sandboxes import census as host
from devtools.harness import census

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
CGROUP_ROOT = Path("/sys/fs/cgroup")


def minbase(lower_root: Path = CACHE / "helper") -> Path:
    """debootstrap --variant=minbase bookworm in ``lower_root`` (where the
    helpers' lowers live), built once (under a lock: parallel runs share the
    cache) and reused."""
    lower_root.mkdir(parents=True, exist_ok=True)
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


def helper_config(base: Path, lower_roots: list[str], probe_lowers: list[str], /, *,
                  name: str = "test", **extra) -> dict:
    """helper.json for a helper living in ``base``; ``extra`` adds or
    overrides keys (ceilings, probe_on_start, a ``containers`` section, even
    ``lower_roots``)."""
    tag = f"camg-{name}-{os.getpid()}-{base.name}"
    return {
        "socket": str(base / "helper.sock"), "state_dir": str(base / "state"),
        "group": "nogroup", "lower_roots": lower_roots,
        "upper_root": str(base / "uppers"), "probe_lowers": probe_lowers,
        "cgroup_parents": {c: str(CGROUP_ROOT / c / tag) for c in host.CONTROLLERS},
        **extra,
    }


class HelperProcess:
    """A running ``python -m helper`` of ours (stopped by pid)."""

    def __init__(self, base: Path, config: dict, proc: subprocess.Popen | None = None, *,
                 owner: str = "test", owns_base: bool = False) -> None:
        """``proc``: a helper already started on ``config``; else ``launch()`` it."""
        self.base = base
        self.config = config
        self.proc = proc
        self.owner = owner
        self.owns_base = owns_base
        #: the container scope (``camg.helper`` label) its mediator uses, if any
        self.scope = (config.get("containers") or {}).get("scope")

    @classmethod
    def start(cls, base: Path, config: dict, *, wait_probes: bool = True, args=(),
              timeout: float = 180.0, **kw) -> "HelperProcess":
        helper = cls(base, config, **kw)
        helper.launch(wait_probes=wait_probes, args=args, timeout=timeout)
        return helper

    def launch(self, *, wait_probes: bool = True, args=(), timeout: float = 180.0) -> None:
        """Write ``base``/helper.json and start the helper; returns once it
        answers a ping (and its isolation probes passed, with ``wait_probes``)."""
        (self.base / "uppers").mkdir(parents=True, exist_ok=True)
        path = self.base / "helper.json"
        path.write_text(json.dumps(self.config))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("NOTIFY_SOCKET", None)
        # Own session: nothing the helper does to its group reaches the caller.
        with open(self.base / "helper.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "helper", "--config", str(path),
                                          *args], cwd=ROOT, env=env, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(self.socket):
                try:
                    if HelperClient(self.socket).ping()["probes_ok"] or not wait_probes:
                        return
                except Exception:  # noqa: BLE001  not listening yet
                    pass
            time.sleep(0.05)
        log = self.log()
        rc = self.proc.poll()
        self.stop()
        raise RuntimeError(f"the helper never became ready (rc {rc}):\n{log[-3000:]}")

    @property
    def socket(self) -> str:
        return self.config["socket"]

    def client(self, owner: str | None = None, **kw) -> HelperClient:
        return HelperClient(self.socket, owner=owner or self.owner, **kw)

    def log(self) -> str:
        return (self.base / "helper.log").read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        return census.rss_kib(self.proc.pid)

    def sandbox_inits(self) -> set[int]:
        """The helper's children that are sandbox inits (helper/initbin.py's
        camg-sbxinit-<digest>): not the warm-upper pool's mkfs.ext4, which
        a disk create starts in the background (helper/upper_pool.py)."""
        return {pid for pid in host.children_of({self.proc.pid})
                if _comm(pid).startswith("camg-sbxinit")}

    def census(self) -> dict[str, int]:
        """What the helper holds now (all zero when nothing leaked)."""
        held = host.holdings(self.config, list(self.config["cgroup_parents"].values()),
                             (str(self.base),))
        return {
            "ledger": len(held["ledger records"]),
            "uppers": len(held["uppers"]),
            "cgroups": len(held["cgroups"]),
            "processes": len(held["processes"]) + len(self.sandbox_inits()),
            "mounts": len(held["mounts"]),
            "containers": census.containers(self.scope) if self.scope else 0,
        }

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (its stop sweep removes its sandboxes and containers),
        then its cgroup parents; its directory too when it made it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_parents(self.config)
        if self.owns_base:
            shutil.rmtree(self.base, ignore_errors=True)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""  # exited since it was listed


def remove_parents(config: dict) -> None:
    for path in config["cgroup_parents"].values():
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass  # already gone (the helper removes the parents it made)


def private_base(name: str) -> Path:
    """A fresh directory ``camg-NAME-PID-…`` for a helper's socket and state."""
    base = Path(tempfile.mkdtemp(prefix=f"camg-{name}-{os.getpid()}-"))
    # The sandbox's uid must reach the socket's directory, no more.
    base.chmod(0o711)
    return base


def start_private(name: str, lower_roots: list[str], probe_lowers: list[str] | None = None, *,
                  owner: str | None = None, wait_probes: bool = True, **extra) -> HelperProcess:
    """A helper in a directory of its own (removed by ``stop()``); ``extra``
    is more helper.json (ceilings, probe_on_start, containers, private_roots)."""
    base = private_base(name)
    config = helper_config(base, lower_roots, probe_lowers or [str(minbase())], name=name, **extra)
    return HelperProcess.start(base, config, wait_probes=wait_probes, owner=owner or name,
                               owns_base=True)
