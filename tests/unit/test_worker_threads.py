"""camg/episodes/worker_threads.py: the episode manager's blocking calls keep the
executor's semantics (bound, deadline, errors, shutdown) at a cheaper hop."""

import asyncio
import threading
import time

import pytest

from camg.errors import DeadlineExceeded, InfraFailure
from camg.episodes.worker_threads import WorkerThreads


def run(coro):
    return asyncio.run(coro)


def test_results_and_errors_reach_the_caller():
    threads = WorkerThreads(2, "t")

    def fail():
        raise ValueError("no")

    def stop():
        raise StopIteration("a future refuses StopIteration itself")

    async def main():
        assert await threads.run(lambda a, b: a + b, 2, 3) == 5
        assert await threads.run(threading.current_thread) is not threading.current_thread()
        with pytest.raises(ValueError, match="no"):
            await threads.run(fail)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(threads.run(stop), 5)
    run(main())
    threads.shutdown()


def test_a_deadline_answers_at_once_and_the_call_runs_on():
    threads = WorkerThreads(2, "t")
    done = threading.Event()

    def slow():
        time.sleep(0.5)
        done.set()
        return "late"

    async def main():
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="slow exceeded 0.1 s"):
            await threads.run(slow, timeout=0.1)
        assert time.monotonic() - started < 0.4
        assert not done.is_set()
        # the late result is dropped, nothing is raised on the loop
        await asyncio.sleep(0.6)
        assert done.is_set()
        assert await threads.run(lambda: 1, timeout=5) == 1
    run(main())
    threads.shutdown()


def test_at_most_max_workers_threads_run_calls_at_once():
    threads = WorkerThreads(3, "t")
    lock = threading.Lock()
    running = peak = 0

    def work():
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return threading.current_thread().name

    async def main():
        return await asyncio.gather(*(threads.run(work) for _ in range(12)))
    names = run(main())
    assert peak == 3 and len(set(names)) == 3
    assert threads.counts()["threads"] == 3
    # sequential calls reuse an idle thread instead of starting more
    run(main())
    assert threads.counts()["threads"] == 3
    threads.shutdown()


def test_shutdown_ends_queued_calls_lets_running_ones_finish_and_refuses_new_ones():
    threads = WorkerThreads(1, "t")
    release = threading.Event()
    ran = []

    def first():
        release.wait(5)
        ran.append("first")
        return "first"

    async def main():
        running = asyncio.ensure_future(threads.run(first))
        queued = asyncio.ensure_future(threads.run(ran.append, "queued"))
        await asyncio.sleep(0.05)
        threads.shutdown()
        threads.shutdown()  # idempotent
        release.set()
        assert await running == "first"
        with pytest.raises(InfraFailure, match="stopped before the call ran"):
            await queued
        with pytest.raises(RuntimeError, match="after shutdown"):
            await threads.run(ran.append, "new")
    run(main())
    assert ran == ["first"]
    for _ in range(50):
        if not any(t.name.startswith("t_") for t in threading.enumerate()):
            break
        time.sleep(0.02)
    assert not any(t.name.startswith("t_") for t in threading.enumerate())


def test_a_result_after_the_loop_closed_is_dropped_quietly():
    threads = WorkerThreads(1, "t")
    release = threading.Event()

    async def main():
        future = threads.submit(release.wait, 5)
        await asyncio.sleep(0)
        return future
    run(main())  # the loop closes with the call still running
    release.set()
    time.sleep(0.1)
    # the thread survived its answer to a closed loop and serves the next
    assert run(threads.run(lambda: "next")) == "next"
    threads.shutdown()


def test_a_calls_outcome_outlives_a_cancelled_wait():
    """What the episode manager hands over when its caller is cancelled
    mid-step: the call runs on and its outcome is there for the next wait."""
    threads = WorkerThreads(1, "t")
    release = threading.Event()

    async def main():
        call = threads.call(lambda: release.wait(5) and "answer", timeout=5)
        waiter = asyncio.ensure_future(call.wait())
        await asyncio.sleep(0.02)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not call.done
        release.set()
        await call.wait()
        assert call.result() == "answer" and call.seconds > 0.01
        late = threads.call(time.sleep, 0.3, timeout=0.05)
        await late.wait()
        with pytest.raises(DeadlineExceeded, match="sleep exceeded 0.05 s"):
            late.result()
        await asyncio.sleep(0.4)  # the late return changes nothing
        assert isinstance(late.error, DeadlineExceeded)
    run(main())
    threads.shutdown()
