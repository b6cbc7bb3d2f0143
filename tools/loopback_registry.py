"""A throwaway local registry (Debian's docker-registry) on loopback.

Tests and the demo build publish images here; it listens on 127.0.0.1
only, without auth, and keeps its storage under a directory we own. It is
stopped by the pid we started, never by name.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from camg.errors import Unavailable

# Loopback only: never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

CONFIG = """version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRegistry:
    def __init__(self, state_dir: Path, *, executable: str = "docker-registry", port: int | None = None):
        self.state_dir = Path(state_dir)
        self.executable = executable
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> "LocalRegistry":
        storage = self.state_dir / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "config.yml"
        config.write_text(CONFIG.format(storage=storage, port=self.port))
        log = open(self.state_dir / "registry.log", "ab")
        try:
            self.proc = subprocess.Popen([self.executable, "serve", str(config)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.state_dir / "registry.log").read_text(errors="replace")[-2000:]
                self.proc = None
                raise Unavailable(f"docker-registry exited at start: {tail}")
            try:
                with _DIRECT.open(f"http://{self.address}/v2/", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        self.stop()
        raise Unavailable(f"docker-registry did not answer on {self.address} within {timeout} s")

    def stop(self) -> None:
        """Idempotent: stopping a registry that already exited is fine."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None
