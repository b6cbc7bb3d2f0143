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
deadline answers DeadlineExceeded at once while its thread finishes the call
and the late result is dropped (a thread cannot be stopped); ``shutdown``
lets running calls finish, ends queued ones with InfraFailure and refuses
new ones.

A ``Call`` keeps its outcome when whoever awaits it is cancelled, so the
episode manager can run a step in the trainer's own request task and, if
that task is cancelled mid-step, hand the step's bookkeeping to a task of
its own without losing what the environment answered (camg/episodes/manager.py).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from camg.errors import DeadlineExceeded, InfraFailure

# put on the queue once per thread by shutdown: the thread leaves
_STOP = None


class Call:
    """One call's outcome on the event loop: ``value`` or ``error``, whichever
    of its return and its deadline came first. Awaiting it may be cancelled
    and resumed; the call and its outcome are unaffected."""

    __slots__ = (
        "_loop",
        "_waiter",
        "_expiry",
        "name",
        "done",
        "value",
        "error",
        "started",
        "ended",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._waiter: asyncio.Future | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self.name = name
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.ended: float | None = None

    async def wait(self) -> None:
        """Until the call ended or its deadline passed; never raises the
        call's own error (``result()`` does)."""
        if self.done:
            return
        if self._waiter is None or self._waiter.done():  # a cancelled wait before
            self._waiter = self._loop.create_future()
        await self._waiter

    def result(self) -> Any:
        if not self.done:
            raise RuntimeError(f"{self.name}: not done")
        if self.error is not None:
            raise self.error
        return self.value

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def abandon(self) -> None:
        """Nobody will wait for the outcome: drop the deadline's timer."""
        if self._expiry is not None:
            self._expiry.cancel()

    def _settle(self, value: Any, error: BaseException | None) -> None:
        if self.done:  # the deadline came first: the late outcome is dropped
            return
        self.done = True
        self.ended = time.monotonic()
        self.value, self.error = value, error
        self.abandon()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self, timeout: float) -> None:
        self._settle(None, DeadlineExceeded(f"{self.name} exceeded {timeout:g} s"))


class WorkerThreads:
    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting on the queue (under _lock)
        self._queued = 0  # calls put and not yet taken (under _lock)
        self._closed = False

    def call(self, fn: Callable, *args: Any, timeout: float | None = None) -> Call:
        """``fn(*args)`` queued for a thread, its outcome in the returned
        Call; DeadlineExceeded past ``timeout`` seconds (call it on the loop)."""
        loop = asyncio.get_running_loop()
        call = Call(loop, getattr(fn, "__name__", "call"))
        self._put((loop, call._settle, fn, args))
        if timeout is not None:
            call._expiry = loop.call_later(timeout, call._expire, timeout)
        return call

    async def run(self, fn: Callable, *args: Any, timeout: float | None = None) -> Any:
        """``fn(*args)``'s result, or its error; DeadlineExceeded past
        ``timeout`` seconds (the call itself runs on to its end)."""
        call = self.call(fn, *args, timeout=timeout)
        try:
            await call.wait()
        except asyncio.CancelledError:
            call.abandon()
            raise
        return call.result()

    def submit(self, fn: Callable, *args: Any) -> asyncio.Future:
        """``fn(*args)`` queued for a thread, its outcome (however late) in
        the returned future of the running loop (call it on the loop)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._put((loop, functools.partial(_settle_future, future), fn, args))
        return future

    def _put(self, item: tuple) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run calls after shutdown")
            self._queued += 1
            start = self._queued > self._idle and len(self._threads) < self.max_workers
            if start:
                thread = threading.Thread(
                    target=self._work, daemon=True, name=f"{self.name}_{len(self._threads)}"
                )
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
            loop, settle, fn, args = item
            try:
                _call_soon(loop, settle, fn(*args), None)
            except BaseException as exc:  # handed to the caller, as an executor does
                _call_soon(loop, settle, None, exc)
            # no reference to the last call (its result, its episode) while idle
            del item, loop, settle, fn, args

    def shutdown(self) -> None:
        """Refuse new calls, end the queued ones with InfraFailure; running
        calls finish. Idempotent."""
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
                loop, settle = item[0], item[1]
                _call_soon(
                    loop,
                    settle,
                    None,
                    InfraFailure(f"{self.name}: the service stopped before the call ran"),
                )
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


def _settle_future(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if error is None:
        future.set_result(value)
    elif isinstance(error, StopIteration):  # a future refuses it (TypeError): the caller would hang
        future.set_exception(RuntimeError(f"the call raised StopIteration: {error}"))
    else:
        future.set_exception(error)
