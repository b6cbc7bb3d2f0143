"""A counting gate, first come first served, for threads: at most ``limit``
holders at once, the rest wait in arrival order until their own deadline.

The helper's container mediator gates creates and starts with it
(helper/container_gate.py), the General service its container boots
(environments/general/environment.py). Standard library only: the helper may
import it (pyproject's layering contracts).

Why the mediator needs one: dockerd serialises much of a container's
creation and start (its own locks, containerd's, runc, the overlay mounts)
and slows down for every one in flight: 256 at once made some single API
calls take over the helper's 60 s api_timeout (53 of 256 failed). With at
most ``limit`` in flight each call stays quick and the rest wait here,
where the wait is the helper's, not Docker's: nothing times out a Docker
call that has not been made. A waiter gives up at its own deadline (the
exception ``late`` makes: ``at_capacity`` in the helper, errors.AtCapacity
in a service) and leaves the queue; a slot it was handed meanwhile is
passed on, never lost.

A slot goes directly from the releaser to the head of the queue (each
waiter has its own Event), so a release wakes one thread, not all, and no
thread arriving later can take a slot ahead of one already waiting.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

# How often a waiter that can be called off (a standby refill) looks.
_CANCEL_POLL = 0.2


class Cancelled(Exception):
    """Raised by acquire when ``cancelled()`` became true while waiting."""


class Gate:
    def __init__(self, limit: int, what: str) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError("limit: a positive integer")
        self.limit = limit
        self.what = what
        self._lock = threading.Lock()
        self._in_flight = 0
        self._queue: collections.deque[threading.Event] = collections.deque()
        # The most in flight at once since this gate was made (Ping; tests).
        self._peak = 0
        self._served = 0

    def late(self, message: str) -> Exception:
        """What a waiter past its deadline raises (a subclass says it in its own taxonomy)."""
        return TimeoutError(message)

    def status(self) -> dict[str, int]:
        """Read together under the lock: in flight, waiting, the limit, the peak."""
        with self._lock:
            return {
                "limit": self.limit,
                "in_flight": self._in_flight,
                "waiting": len(self._queue),
                "peak": self._peak,
                "served": self._served,
            }

    def _take(self) -> None:
        """Called with the lock held."""
        self._in_flight += 1
        self._served += 1
        self._peak = max(self._peak, self._in_flight)

    def acquire(self, deadline: float, cancelled: Callable[[], bool] | None = None) -> None:
        """A slot, waiting in arrival order until ``deadline`` (time.monotonic())."""
        with self._lock:
            if not self._queue and self._in_flight < self.limit:
                self._take()
                return
            granted = threading.Event()
            self._queue.append(granted)
            waiting = len(self._queue)
        while True:
            remaining = deadline - time.monotonic()
            step = remaining if cancelled is None else min(remaining, _CANCEL_POLL)
            if step > 0 and granted.wait(step):
                return  # handed over by release(): counted there
            with self._lock:
                if granted.is_set():
                    return
                expired = time.monotonic() >= deadline
                if expired or (cancelled is not None and cancelled()):
                    self._queue.remove(granted)
                    if expired:
                        raise self.late(
                            f"no {self.what} slot within the deadline: "
                            f"{self._in_flight} of {self.limit} in flight, "
                            f"{len(self._queue)} more waiting (was {waiting - 1} ahead)"
                        )
                    raise Cancelled()

    def release(self) -> None:
        with self._lock:
            if self._queue:
                # The slot passes to the head of the queue: in_flight stays.
                self._served += 1
                self._queue.popleft().set()
            else:
                self._in_flight -= 1

    @contextlib.contextmanager
    def slot(self, deadline: float, cancelled: Callable[[], bool] | None = None) -> Iterator[None]:
        self.acquire(deadline, cancelled)
        try:
            yield
        finally:
            self.release()
