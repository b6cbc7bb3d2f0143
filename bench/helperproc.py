"""A private camg-helper for a benchmark: its own socket, state and cgroup
parents (tagged with the bench's pid so leak checks know whose they are),
started in the foreground and removed completely by ``stop()``."""

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camg.helper_client import HelperClient  # noqa: E402

CONTROLLERS = ("cpu", "memory", "pids", "freezer")


class PrivateHelper:
    def __init__(self, name: str, lower_roots: list[str], probe_lowers: list[str]) -> None:
        tag = f"camg-{name}-{os.getpid()}"
        self.base = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
        # The sandbox's uid must reach the socket's directory, no more.
        self.base.chmod(0o711)
        self.cfg = {
            "socket": str(self.base / "helper.sock"), "state_dir": str(self.base / "state"),
            "group": "nogroup", "lower_roots": lower_roots,
            "upper_root": str(self.base / "uppers"), "probe_lowers": probe_lowers,
            "cgroup_parents": {c: f"/sys/fs/cgroup/{c}/{tag}" for c in CONTROLLERS},
        }
        (self.base / "uppers").mkdir()
        (self.base / "helper.json").write_text(json.dumps(self.cfg))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("NOTIFY_SOCKET", None)
        # Own session: nothing the helper does to its group reaches the bench.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "helper", "--config", str(self.base / "helper.json")],
            cwd=ROOT, env=env, start_new_session=True,
            stderr=open(self.base / "helper.log", "wb"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if HelperClient(self.socket).ping()["probes_ok"]:
                    return
            except Exception:  # not listening yet
                time.sleep(0.1)
        log = (self.base / "helper.log").read_text()
        self.stop()
        raise SystemExit("helper never became ready:\n" + log)

    @property
    def socket(self) -> str:
        return self.cfg["socket"]

    def client(self, owner: str = "bench", pool_size: int = 8) -> HelperClient:
        return HelperClient(self.socket, owner=owner, pool_size=pool_size)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        for path in self.cfg["cgroup_parents"].values():
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass  # already gone
        shutil.rmtree(self.base, ignore_errors=True)
