"""The admission line: ``POST /episodes`` waits here for a slot.

A create that finds the service at capacity and asked for ``wait_s`` > 0
queues in FIFO order; a slot freed by an ending episode goes to the
oldest waiter. The line is bounded (``queue_bound``): a create that finds
it full is answered 429 at once, as is one that waited ``wait_s`` in vain.
A waiter that leaves (its client hung up, its task was cancelled) takes
its entry with it, and a slot it was granted but never used passes on to
the next waiter, so nobody holds a slot for a trainer that is gone.

It lives on the service's event loop, like the episode manager, and knows
nothing of episodes: the manager tells it how many slots are free
(``free``) and calls ``wake`` whenever one may have freed.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

from camg.errors import AtCapacity, Unavailable

#: the line's length per slot when the deployment names no queue_bound:
#: a GRPO group of 8 on a capacity-2 service fits (2 + 8 >= 8)
QUEUE_PER_SLOT = 4
#: Retry-After (seconds) of a 429 from a full line or an expired wait
RETRY_AFTER_S = 5


def default_queue_bound(capacity: int) -> int:
    return QUEUE_PER_SLOT * capacity


class Admission:
    def __init__(self, free: Callable[[], int], bound: int) -> None:
        self._free = free
        self.bound = bound
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        # Slots handed to waiters that have not resumed yet: a newcomer must
        # not take them in between.
        self._granted = 0
        self._closed: Exception | None = None

    def counts(self) -> dict:
        return {"queued": len(self._waiters), "queue_bound": self.bound}

    def _available(self) -> int:
        return self._free() - self._granted

    async def enter(
        self, wait_s: float, hangup: Callable[[], Awaitable[Any]] | None = None
    ) -> None:
        """Return once this caller may take a slot (it must take it before
        its next ``await``, or call ``wake``); AtCapacity when it may not."""
        if self._closed is not None:
            raise self._closed
        # Nobody jumps the line: a free slot goes to a waiter first.
        if not self._waiters and self._available() > 0:
            return
        if wait_s <= 0:
            raise AtCapacity("every slot is taken", retry_after=RETRY_AFTER_S, **self.counts())
        if len(self._waiters) >= self.bound:
            raise AtCapacity(
                f"every slot is taken and the line is full ({self.bound} waiting)",
                retry_after=RETRY_AFTER_S,
                **self.counts(),
            )
        granted: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        watch = asyncio.ensure_future(hangup()) if hangup is not None else None
        try:
            await asyncio.wait(
                [granted] if watch is None else [granted, watch],
                timeout=wait_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:  # cancelled: the server dropped the request
            self._stop_watching(watch)
            if self._leave(granted):
                self.wake()  # a grant nobody will use passes on
            raise
        hung_up = self._stop_watching(watch)
        if self._leave(granted):
            if not hung_up:
                return
            self.wake()
        if hung_up:
            raise AtCapacity("the client went away while waiting", retry_after=RETRY_AFTER_S)
        if granted.done() and not granted.cancelled():
            closed = granted.exception()  # closed while waiting
            assert closed is not None  # _leave found no grant, so close() set the error
            raise closed
        raise AtCapacity(
            f"no slot freed within {wait_s:g} s", retry_after=RETRY_AFTER_S, **self.counts()
        )

    @staticmethod
    def _stop_watching(watch: asyncio.Future | None) -> bool:
        """Whether the client hung up (the watch ended on its own)."""
        if watch is None:
            return False
        if not watch.done():
            watch.cancel()
            return False
        if not watch.cancelled():
            watch.exception()  # retrieved: a broken receive is a hang-up too
        return True

    def _leave(self, granted: asyncio.Future) -> bool:
        """Take the entry off the line; whether it had been granted a slot
        (which is then the caller's to take or pass on)."""
        try:
            self._waiters.remove(granted)
        except ValueError:  # a grant (or close) already took it off the line
            pass
        if granted.done() and not granted.cancelled() and granted.exception() is None:
            self._granted -= 1
            return True
        granted.cancel()
        return False

    def wake(self) -> None:
        """Hand free slots to the oldest waiters."""
        while self._waiters and self._available() > 0:
            granted = self._waiters.popleft()
            if not granted.done():
                granted.set_result(None)
                self._granted += 1

    def close(self, error: Exception | None = None) -> None:
        """Refuse every waiter and newcomer (the service is stopping)."""
        self._closed = error or Unavailable("service is shutting down")
        while self._waiters:
            granted = self._waiters.popleft()
            if not granted.done():
                granted.set_exception(self._closed)


def hangup(req: Any) -> Callable[[], Awaitable[None]] | None:
    """An awaitable factory that completes when the HTTP client of a falcon
    ASGI request hangs up (``http.disconnect``), so a queued create leaves
    the line at once rather than when the server cancels its task.

    Falcon keeps the ASGI receive callable only privately; without it the
    server's cancellation (gunicorn: asgi_disconnect_grace_period) still
    takes the entry off the line.
    """
    receive = getattr(req, "_receive", None)
    if receive is None:
        return None

    async def hung_up() -> None:
        # After the body, the server answers receive() only at disconnect.
        while (await receive()).get("type") != "http.disconnect":
            await asyncio.sleep(0)

    return hung_up
