"""The container mediator's start gate (helper/container_gate.py): first come
first served, never more than its limit in flight, a waiter past its
deadline gets at_capacity and leaves without taking a slot with it; and the
mediator's creates (run and standby) go through it. Docker is stood in for
by a slow recorder here; tests/privileged/test_containers.py starts real
containers through a gate of 2."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from camg import errors, helper_client
from camg import helper_wire as wire
from camg.typed import parse
from helper import config as helper_config
from helper import container_verbs as cv
from helper import containers as mc
from helper.container_config import ContainerConfig, ContainerConfigError
from helper.container_gate import Cancelled, Gate
from helper.sandbox_table import Peer

IMAGE = "127.0.0.1:5000/camg/x@sha256:" + "a" * 64
PEER = Peer(uid=990, gid=990, pid=1, owner="general")


def wait_for(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.002)


def far() -> float:
    return time.monotonic() + 30


# -- the gate ----------------------------------------------------------------------

def test_waiters_are_served_in_arrival_order():
    gate = Gate(1)
    gate.acquire(far())
    order: list[int] = []
    threads = []
    for i in range(6):
        def run(i=i):
            with gate.slot(far()):
                order.append(i)
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        # the next one arrives only once this one is queued
        wait_for(lambda i=i: gate.status()["waiting"] == i + 1)
    gate.release()
    for t in threads:
        t.join(5)
    assert order == list(range(6))
    assert gate.status() == {"limit": 1, "in_flight": 0, "waiting": 0, "peak": 1, "served": 7}


def test_a_newcomer_does_not_overtake_a_waiter():
    gate = Gate(1)
    gate.acquire(far())
    got: list[str] = []
    first = threading.Thread(target=lambda: (gate.acquire(far()), got.append("first")))
    first.start()
    wait_for(lambda: gate.status()["waiting"] == 1)
    gate.release()  # handed to `first`, not free for whoever comes next
    first.join(5)
    with pytest.raises(wire.WireError):
        gate.acquire(time.monotonic() + 0.05)
    assert got == ["first"] and gate.status()["in_flight"] == 1
    gate.release()
    assert gate.status()["in_flight"] == 0


def test_the_limit_is_never_exceeded_and_is_reached():
    gate = Gate(3)
    lock = threading.Lock()
    now = {"n": 0, "max": 0}

    def run():
        with gate.slot(far()):
            with lock:
                now["n"] += 1
                now["max"] = max(now["max"], now["n"])
            time.sleep(0.01)
            with lock:
                now["n"] -= 1

    threads = [threading.Thread(target=run) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert now["max"] == 3
    assert gate.status() == {"limit": 3, "in_flight": 0, "waiting": 0, "peak": 3, "served": 40}


def test_a_waiter_past_its_deadline_gets_at_capacity_and_leaks_no_slot():
    gate = Gate(1)
    gate.acquire(far())
    late: dict = {}
    later: list[str] = []

    def impatient():
        t0 = time.monotonic()
        try:
            gate.acquire(t0 + 0.2)
        except wire.WireError as exc:
            late.update(error=exc, waited=time.monotonic() - t0)

    a = threading.Thread(target=impatient)
    a.start()
    wait_for(lambda: gate.status()["waiting"] == 1)
    b = threading.Thread(target=lambda: (gate.acquire(far()), later.append("b")))
    b.start()
    wait_for(lambda: gate.status()["waiting"] == 2)
    a.join(5)
    assert late["error"].name == "at_capacity" and 0.2 <= late["waited"] < 2, late
    # The client's typed error for it.
    assert isinstance(helper_client.error_from_reply({"error": "at_capacity", "message": "x"}),
                      errors.AtCapacity)
    assert gate.status()["waiting"] == 1  # its place is gone, the one behind it stays
    gate.release()
    b.join(5)
    assert later == ["b"] and gate.status()["in_flight"] == 1
    gate.release()
    assert gate.status()["in_flight"] == 0
    # all slots are there again: `limit` at once without waiting
    gate.acquire(time.monotonic())
    gate.release()


def test_a_called_off_waiter_leaves_the_queue():
    gate = Gate(1)
    gate.acquire(far())
    stop = threading.Event()
    out: list[str] = []

    def run():
        try:
            gate.acquire(far(), cancelled=stop.is_set)
        except Cancelled:
            out.append("cancelled")

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: gate.status()["waiting"] == 1)
    stop.set()
    t.join(5)
    assert out == ["cancelled"] and gate.status()["waiting"] == 0
    gate.release()
    assert gate.status()["in_flight"] == 0


# -- its configuration ----------------------------------------------------------------

def test_concurrent_starts_is_a_validated_positive_integer():
    assert ContainerConfig().concurrent_starts == 8
    assert ContainerConfig().start_wait_timeout == 600.0
    assert parse(ContainerConfig, {"concurrent_starts": 2}, "containers",
                 ContainerConfigError).concurrent_starts == 2
    for bad in (0, -1, True, 1.5, "8"):
        with pytest.raises((ContainerConfigError, ValueError)):
            parse(ContainerConfig, {"concurrent_starts": bad}, "containers", ContainerConfigError)
    for bad in (0, -1.0):
        with pytest.raises(ContainerConfigError):
            ContainerConfig(start_wait_timeout=bad)
    with pytest.raises(helper_config.ConfigError):
        parse(helper_config.HelperConfig, {"containers": {"concurrent_starts": 0}}, "helper",
              helper_config.ConfigError)


# -- the mediator's creates ----------------------------------------------------------

class SlowDocker:
    """Takes `delay` per create and per run, counting how many are inside at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.n = 0
        self.removed: list[str] = []

    def _enter(self) -> str:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.n += 1
            return f"{self.n:064x}"

    def _leave(self) -> None:
        with self.lock:
            self.inside -= 1

    def run(self, **kw):
        cid = self._enter()
        time.sleep(self.delay)
        self._leave()
        return cid, os.getpid()

    def create(self, **kw):
        cid = self._enter()
        time.sleep(self.delay)
        self._leave()
        return cid, None

    def remove(self, cid):
        self.removed.append(cid)
        return True

    def remove_labelled(self, labels):
        return 0

    def remove_images_labelled(self, labels):
        return 0


@pytest.fixture
def m(tmp_path):
    manifest = tmp_path / "images.json"
    manifest.write_text(json.dumps({"images": [IMAGE]}))
    cfg = ContainerConfig(images_manifest=str(manifest), scope="unit", concurrent_starts=2,
                          start_wait_timeout=0.3, containers_per_peer=16)
    mediator = mc.Mediator(cfg, agent_uid=2000, agent_gid=2000, ceilings=helper_config.Ceilings())
    mediator.docker = SlowDocker(0.1)
    yield mediator
    mediator.standby.drop_peer(PEER)
    for held in list(mediator.held.values()):
        if held.pidfd >= 0:
            os.close(held.pidfd)


def params(**kw) -> wire.ContainerCreateParams:
    base = dict(image=IMAGE, cpu=1.0, memory_bytes=256 << 20, pids_max=128)
    base.update(kw)
    return wire.ContainerCreateParams(**base)


def test_creates_go_through_the_gate_and_late_ones_are_refused_cleanly(m):
    results: list = []

    def create(i):
        try:
            results.append(m.create(PEER, params(episode_id=f"e{i}")))
        except wire.WireError as exc:
            results.append(exc)

    # 8 at once, 2 at a time, 0.5 s each: the 6 behind the first 2 run
    # out of their 0.3 s for a slot.
    m.docker.delay = 0.5
    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    made = [r for r in results if isinstance(r, mc.Held)]
    refused = [r for r in results if isinstance(r, wire.WireError)]
    assert m.docker.most == 2 and m.starts.status()["peak"] == 2
    assert len(made) == 2 and len(refused) == 6
    assert {r.name for r in refused} == {"at_capacity"}
    assert m.docker.n == len(made)  # a refused create never reached Docker
    # Nothing of the refused ones is held (their admission placeholders
    # went) and every slot is free again.
    assert sorted(m.held) == sorted(h.id for h in made)
    assert m.starts.status() == {"limit": 2, "in_flight": 0, "waiting": 0, "peak": 2, "served": len(made)}


def test_standby_refills_share_the_gate(m):
    m.cfg = ContainerConfig(images_manifest=m.cfg.images_manifest, scope="unit", concurrent_starts=2,
                            start_wait_timeout=30.0, containers_per_peer=16)
    parents = [m.create(PEER, params(episode_id=f"p{i}", command=("sleep", str(i)))) for i in range(4)]
    for held in parents:
        m.standby.refill(PEER, held.params)  # 4 specs x 2 standbys, filled in the background
    wait_for(lambda: len(m.standby.ids()) == 8, timeout=10)
    assert m.docker.most == 2 and m.starts.status()["peak"] == 2


def test_ping_reports_starts_without_making_the_mediator(monkeypatch):
    monkeypatch.setattr(mc, "_mediator", None)
    ctx = type("Ctx", (), {})()
    ctx.registry = type("Reg", (), {})()
    ctx.registry.config = helper_config.HelperConfig()
    assert cv.start_status(ctx) == {"limit": 0, "in_flight": 0, "waiting": 0, "peak": 0, "served": 0}
    ctx.registry.config = helper_config.HelperConfig(containers=ContainerConfig(concurrent_starts=3))
    assert cv.start_status(ctx)["limit"] == 3 and mc._mediator is None
