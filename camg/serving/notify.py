"""sd_notify for a gunicorn-based service.

gunicorn's arbiter says READY=1 as soon as it has bound its listener, before
any worker has loaded the environment (a JVM, an index, a helper
connection). We want READY=1 to mean "can serve an episode", so
``camg.serve`` moves NOTIFY_SOCKET aside before starting the arbiter and the
worker reports readiness itself, with MAINPID= naming the arbiter (units
use NotifyAccess=all so systemd accepts a worker's message).
"""

from __future__ import annotations

import os

import sdnotify

STASH = "CAMG_NOTIFY_SOCKET"


def stash_notify_socket() -> None:
    """Hide NOTIFY_SOCKET from gunicorn's arbiter; workers inherit the stash."""
    if "NOTIFY_SOCKET" in os.environ:
        os.environ[STASH] = os.environ.pop("NOTIFY_SOCKET")


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get(STASH) or os.environ.get("NOTIFY_SOCKET")
        self.enabled = bool(address)
        self._notifier = None
        if address:
            saved = os.environ.get("NOTIFY_SOCKET")
            os.environ["NOTIFY_SOCKET"] = address
            try:
                self._notifier = sdnotify.SystemdNotifier()
            finally:
                if saved is None:
                    os.environ.pop("NOTIFY_SOCKET", None)
        usec = os.environ.get("WATCHDOG_USEC", "")
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None

    def send(self, **fields: object) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(f"{k}={v}" for k, v in fields.items()))

    def ready(self, status: str) -> None:
        self.send(READY=1, MAINPID=os.getppid(), STATUS=status)

    def status(self, status: str) -> None:
        self.send(STATUS=status)

    def watchdog(self) -> None:
        self.send(WATCHDOG=1)

    def stopping(self) -> None:
        self.send(STOPPING=1, STATUS="closing episodes")
