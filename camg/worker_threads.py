"""Blocking calls off the event loop: a bounded set of threads that answer
each call on the caller's loop, with the call's deadline on that loop.

An environment's reset, step and grade block (a search in the JVM, an exec
in a sandbox, a container's verifier), so the episode manager runs them on
threads. ``loop.run_in_executor`` over a ThreadPoolExecutor costs a
concurrent Future with its condition variable, the executor's idle
semaphore and a second future chained to the first on every call, and
``asyncio.wait_for`` a task more; on this 2-core host that round trip took
31 us p50 against 10 us for a plain queue and one ``call_soon_threadsafe``
(issue 25's HTTP step overhead, where every step pays it once).

Semantics are the executor's where the manager relied on them: at most
``max_workers`` threads, started as calls find none idle; a call past its
deadline raises DeadlineExceeded at once while its thread finishes the call
and the result is dropped (a thread cannot be stopped); ``shutdown`` lets
running calls finish, cancels queued ones and refuses new ones.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

from camg.errors import DeadlineExceeded

# put on the queue once per thread by shutdown: the thread leaves
_STOP = None


class WorkerThreads:
    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0      # threads waiting on the queue (under _lock)
        self._queued = 0    # calls put and not yet taken (under _lock)
        self._closed = False

    async def run(self, fn: Callable, *args: Any, timeout: float | None = None) -> Any:
        """``fn(*args)`` on one of the threads; DeadlineExceeded past ``timeout``
        seconds (the call itself runs on to its end)."""
        future = self.submit(fn, *args)
        if timeout is None:
            return await future
        expiry = future.get_loop().call_later(timeout, _expire, future, fn, timeout)
        try:
            return await future
        finally:
            expiry.cancel()

    def submit(self, fn: Callable, *args: Any) -> asyncio.Future:
        """``fn(*args)`` queued for a thread; its outcome in the returned
        future of the running loop (call it on the loop)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._put((loop, future, fn, args))
        return future

    def _put(self, item: tuple) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run calls after shutdown")
            self._queued += 1
            start = self._queued > self._idle and len(self._threads) < self.max_workers
            if start:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self.name}_{len(self._threads)}")
                self._threads.append(thread)
        self._queue.put(item)
        if start:
            thread.start()

    def _work(self) -> None:
        get, lock = self._queue.get, self._lock
        while True:
            with lock:
                self._idle += 1
            item = get()
            with lock:
                self._idle -= 1
                if item is not _STOP:
                    self._queued -= 1
            if item is _STOP:
                return
            loop, future, fn, args = item
            try:
                _call_soon(loop, _set_result, future, fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor does
                _call_soon(loop, _set_exception, future, exc)
            # no reference to the last call (its result, its episode) while idle
            del item, loop, future, fn, args

    def shutdown(self) -> None:
        """Refuse new calls, cancel the queued ones; running calls finish.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = len(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                with self._lock:
                    self._queued -= 1
                loop, future = item[0], item[1]
                _call_soon(loop, _cancel, future)
        for _ in range(threads):
            self._queue.put(_STOP)

    def counts(self) -> dict:
        with self._lock:
            return {"threads": len(self._threads), "idle": self._idle, "queued": self._queued}


def _call_soon(loop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():  # past its deadline, or the caller was cancelled
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        if isinstance(exc, StopIteration):  # a future refuses it (TypeError): the caller would hang
            exc = RuntimeError(f"the call raised StopIteration: {exc}")
        future.set_exception(exc)


def _cancel(future: asyncio.Future) -> None:
    future.cancel()


def _expire(future: asyncio.Future, fn: Callable, timeout: float) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded(
            f"{getattr(fn, '__name__', 'call')} exceeded {timeout:g} s"))
