"""General's boot gate (environments/general/environment.py): a reset the warm
pool cannot serve boots a container and holds a slot until the transport's
reset has answered (its setup starts every MCP server once, seconds of
CPU); at most Settings.concurrent_boots do that at once, in arrival order,
while a warm container is handed out without waiting. A reset that waited
boot_wait_s in vain is refused at_capacity and created nothing; one closed
while waiting creates nothing either. The pool and the transport are
stood in for; tests/privileged/test_general_episodes.py boots real ones."""

from __future__ import annotations

import threading
import time
import types

import pytest

from camg import errors
from camg.sandboxes.containers import Container
from camg.environment import Task
from environments.general import environment as ge
from environments.general.settings import Settings

IMAGE = "127.0.0.1:5000/camg/t@sha256:" + "b" * 64


class Pool:
    """take(): the warm containers given; create(): a new one, counted."""

    def __init__(self, warm: int = 0) -> None:
        self.warm = [Container(f"{i:064x}", IMAGE, "", True) for i in range(warm)]
        self.created: list[str] = []
        self.lock = threading.Lock()

    def take(self, episode_id: str = ""):
        with self.lock:
            return self.warm.pop() if self.warm else None

    def create(self, episode_id: str = ""):
        with self.lock:
            self.created.append(episode_id)
            return Container(f"{len(self.created) + 1000:064x}", IMAGE, episode_id, False)


class Env:
    def __init__(self, settings: Settings, pool: Pool) -> None:
        self.settings = settings
        self.pools = {IMAGE: pool}
        self.boots = ge.BootGate(ge.boot_limit(settings), "container boot")
        self.client = types.SimpleNamespace(remove=lambda cid: True)


TASK = Task("t1", {"kind": "general_agent", "image": IMAGE, "instance_id": "t1"})


@pytest.fixture
def transport(monkeypatch):
    """The transport's reset: ``hold`` seconds (``held``: per episode),
    recording how many run at once."""
    seen = {"now": 0, "most": 0, "hold": 0.05, "held": {}, "order": []}
    lock = threading.Lock()

    def open_transport(self):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["order"].append(self.episode_id)
        time.sleep(seen["held"].get(self.episode_id, seen["hold"]))
        with lock:
            seen["now"] -= 1
        return {"observation": {"output": "ready"}, "reward": 0.0, "done": False}

    monkeypatch.setattr(ge.GeneralEpisode, "_open_transport", open_transport)
    monkeypatch.setattr(ge, "observation_of", lambda payload: (payload["observation"], 0.0, False))
    return seen


def test_default_is_four_per_core_and_an_explicit_setting_wins():
    assert ge.boot_limit(Settings(), cores=2) == 8
    assert ge.boot_limit(Settings(), cores=16) == 64
    assert ge.boot_limit(Settings(concurrent_boots=3), cores=16) == 3
    for bad in ({"concurrent_boots": -1}, {"concurrent_boots": 2000}, {"concurrent_boots": True},
                {"boot_wait_s": 0}):
        with pytest.raises(ValueError):
            Settings(**bad)


def test_boots_never_exceed_the_limit_and_go_in_arrival_order(transport):
    pool = Pool()
    env = Env(Settings(concurrent_boots=2), pool)
    episodes = [ge.GeneralEpisode(env, TASK, f"e{i}") for i in range(8)]
    threads = []
    for n, e in enumerate(episodes, 1):
        # started one by one, each once the gate has seen it (served or
        # queued): the arrival order is known however loaded the host is
        threads.append(threading.Thread(target=e.reset))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = env.boots.status()
            if status["served"] + status["waiting"] >= n:
                break
            time.sleep(0.001)
    for t in threads:
        t.join(10)
    assert transport["most"] == 2
    assert len(pool.created) == 8 and sorted(transport["order"]) == [f"e{i}" for i in range(8)]
    # Slots go in arrival order; two granted at about the same time may
    # start their transports in either order, never one arrival further.
    at = {name: i for i, name in enumerate(transport["order"])}
    assert all(at[f"e{i}"] < at[f"e{j}"] for i in range(8) for j in range(i + 2, 8)), transport
    status = env.boots.status()
    assert status["in_flight"] == 0 and status["waiting"] == 0 and status["peak"] == 2
    assert all(e.container is not None for e in episodes)


def test_a_warm_container_does_not_wait_behind_boots(transport):
    pool = Pool(warm=1)
    env = Env(Settings(concurrent_boots=1), pool)
    transport["held"] = {"cold": 0.5, "warm": 0.0}
    booting = threading.Thread(target=ge.GeneralEpisode(env, TASK, "cold").reset)
    pool.warm, warm = [], pool.warm  # the first reset must miss
    booting.start()
    time.sleep(0.05)
    pool.warm = warm
    started = time.monotonic()
    ge.GeneralEpisode(env, TASK, "warm").reset()
    assert time.monotonic() - started < 0.45  # not behind the 0.5 s boot
    booting.join(5)
    assert pool.created == ["cold"]


def test_a_late_waiter_is_refused_at_capacity_and_creates_nothing(transport):
    pool = Pool()
    env = Env(Settings(concurrent_boots=1, boot_wait_s=0.2), pool)
    transport["hold"] = 1.0
    first = threading.Thread(target=ge.GeneralEpisode(env, TASK, "first").reset)
    first.start()
    time.sleep(0.05)
    late = ge.GeneralEpisode(env, TASK, "late")
    with pytest.raises(errors.AtCapacity) as refused:
        late.reset()
    assert "container boot" in refused.value.message and refused.value.retry_after > 0
    assert late.container is None and pool.created == ["first"]
    first.join(5)
    assert env.boots.status() == {"limit": 1, "in_flight": 0, "waiting": 0, "peak": 1, "served": 1}


def test_an_episode_closed_while_waiting_creates_nothing(transport):
    pool = Pool()
    env = Env(Settings(concurrent_boots=1), pool)
    transport["hold"] = 0.4
    first = threading.Thread(target=ge.GeneralEpisode(env, TASK, "first").reset)
    first.start()
    time.sleep(0.05)
    waiting = ge.GeneralEpisode(env, TASK, "closed")
    failed: dict = {}

    def reset() -> None:
        try:
            waiting.reset()
        except errors.InfraFailure as exc:
            failed["error"] = exc
    t = threading.Thread(target=reset)
    t.start()
    time.sleep(0.05)
    waiting.close()
    t.join(5)
    first.join(5)
    assert "closed during reset" in str(failed["error"])
    assert pool.created == ["first"] and env.boots.status()["in_flight"] == 0
