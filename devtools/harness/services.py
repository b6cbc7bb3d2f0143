"""Fixtures' building blocks: configure a service for real and run it as a
real ``python -m camg.serve`` process on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.configure import configure
from camg_client import Client
from devtools.harness.auth import deployment_auth

REPO = Path(__file__).resolve().parents[2]
COUNTER_FACTORY = "devtools.harness.counter_env:CounterEnvironment"
VARIANT_COUNTER_FACTORY = "devtools.harness.counter_env:VariantCounterEnvironment"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_git_tree(path: Path) -> Path:
    """A committed, clean git checkout standing in for the source tree."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "README").write_text("source\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "source"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)
    return path


def counter_tasks(n: int = 5) -> list[dict]:
    # Deliberately not sorted: order must survive configure untouched.
    ids = [f"task-{i:02d}" for i in range(n)][::-1]
    return [{"task_id": tid, "data": {"target": 7 * (i + 1) % 100}} for i, tid in enumerate(ids)]


def configure_counter(tmp: Path, *, tasks: list[dict] | None = None, capacity: int = 4,
                      limits: dict | None = None, settings: dict | None = None,
                      sampling: dict | None = None, references: bool = False,
                      auth: dict | None = None, variants: list | None = None,
                      canary_fraction: float = 0.0, factory: str = COUNTER_FACTORY) -> Path:
    """Write manifest + deployment and run camg.configure; return the config
    path. ``auth``: the deployment's auth entry (default: the test session's);
    ``variants``: camg.config.variants.Variant objects for the manifest (serve them
    with VARIANT_COUNTER_FACTORY)."""
    tmp.mkdir(parents=True, exist_ok=True)
    lock = tmp / "requirements.lock"
    lock.write_text("falcon==4.4.0\n")
    body = manifest.build("counter", tasks or counter_tasks(), created_by="tests",
                          sampling=sampling or {"mode": "sequential", "seed": 0}, files={},
                          variants=variants or ())
    manifest.write(tmp / "counter-manifest.json", body)
    deployment = {
        "runtime_lock": str(lock),
        "auth": auth if auth is not None else deployment_auth(),
        "state_root": str(tmp / "state"),
        "helper_socket": str(tmp / "helper.sock"),
        "executables": {"python": sys.executable},
        "environments": {"counter": {
            "manifest": "counter-manifest.json", "port": free_port(), "capacity": capacity,
            "factory": factory, "limits": limits or {}, "settings": settings or {},
            "references": references, "canary_fraction": canary_fraction}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "counter.json"


class ServiceProcess:
    """``python -m camg.serve`` in a child process we own (stopped by pid)."""

    def __init__(self, config_path: Path, env: dict | None = None) -> None:
        self.config_path = config_path
        self.config = json.loads(config_path.read_text())
        self.url = f"http://127.0.0.1:{self.config['port']}"
        self.log_path = config_path.parent / "service.log"
        # the checkout first, then what the caller's environment puts on the
        # path (a package installed there, as tests/unit/test_plugins.py's toy)
        path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(env or {})}
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "camg.serve", "--config",
                                      str(config_path)], env=environ, cwd=REPO,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30.0) -> "ServiceProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited {self.proc.returncode}:\n{self.output()}")
            try:
                if Client(self.url, timeout=2).health()["status"] == "healthy":
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"service not ready:\n{self.output()}")

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def outcomes(self) -> list[dict]:
        path = Path(self.config["state_dir"]) / "outcomes.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
