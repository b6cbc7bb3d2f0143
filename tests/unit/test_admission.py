"""The admission line (camg.episodes.admission): POST /episodes with wait_s queues in
FIFO order for a slot, bounded, on the framework's counter environment in
this process, and over HTTP against a real camg.serve."""

from __future__ import annotations

import asyncio
import json

import pytest

from camg.web import http_wire as wire
from camg.environment import ServiceContext, Task
from camg.episodes.manager import EpisodeManager
from camg.errors import AtCapacity, BadRequest, Unavailable
from camg.episodes.outcomes import OutcomeLog
from camg.config.service_config import Limits
from camg_client import AtCapacity as ClientAtCapacity, Client, ServiceError
from tests.support.polling import until
from devtools.harness.auth import session_token
from devtools.harness.counter_env import CounterEnvironment


def manager(tmp_path, capacity=2, queue_bound=None) -> EpisodeManager:
    env = CounterEnvironment(ServiceContext("counter", str(tmp_path), {}),
                             [Task(f"t{i}", {"target": i}) for i in range(4)])
    return EpisodeManager(env, capacity=capacity, limits=Limits(), config_hash="h",
                          outcomes=OutcomeLog(tmp_path), queue_bound=queue_bound)


def create(m, episode_id, wait_s=0.0, hangup=None):
    return m.create(wire.CreateEpisode(episode_id=episode_id, wait_s=wait_s), hangup)


def test_a_group_of_8_waits_for_2_slots_and_is_served_in_arrival_order(tmp_path):
    m = manager(tmp_path, capacity=2)

    async def scenario():
        order: list[str] = []
        go = asyncio.Event()

        async def one(i):
            body = await create(m, f"e{i}", wait_s=30)
            order.append(body["episode_id"])
            await go.wait()
            await asyncio.sleep(0.02)  # a short episode, then its slot frees
            await m.close(body["episode_id"])

        tasks = []
        for i in range(8):  # arrival order is e0..e7
            tasks.append(asyncio.ensure_future(one(i)))
            await until(lambda: len(order) + m.admission.counts()["queued"] == i + 1)
        assert m.admission.counts()["queued"] == 6 and m.active() == 2
        go.set()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    assert order == [f"e{i}" for i in range(8)]  # FIFO: every slot went to the oldest
    assert m.counts() == {"active": 0, "capacity": 2, "finished": 8, "queued": 0,
                          "queue_bound": 8}
    m.threads.shutdown()


def test_a_newcomer_does_not_jump_the_line(tmp_path):
    m = manager(tmp_path, capacity=1)

    async def scenario():
        await create(m, "a")
        waiter = asyncio.ensure_future(create(m, "b", wait_s=30))
        await until(lambda: m.admission.counts()["queued"] == 1)
        closing = asyncio.ensure_future(m.close("a"))
        # while the slot is handed over, a create that does not wait is refused
        with pytest.raises(AtCapacity):
            await create(m, "c")
        await closing
        assert (await waiter)["episode_id"] == "b"
        with pytest.raises(AtCapacity):
            await create(m, "d")

    asyncio.run(scenario())
    m.threads.shutdown()


def test_a_full_line_answers_429_at_once(tmp_path):
    m = manager(tmp_path, capacity=1, queue_bound=2)

    async def scenario():
        await create(m, "a")
        waiters = [asyncio.ensure_future(create(m, f"w{i}", wait_s=30)) for i in range(2)]
        await until(lambda: m.admission.counts()["queued"] == 2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(AtCapacity) as info:
            await create(m, "late", wait_s=30)
        assert loop.time() - started < 0.5
        assert info.value.retry_after >= 1 and info.value.details["queue_bound"] == 2
        assert m.counts()["queued"] == 2
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert m.counts()["queued"] == 0

    asyncio.run(scenario())
    m.threads.shutdown()


def test_an_expired_wait_is_429_and_leaves_no_entry(tmp_path):
    m = manager(tmp_path, capacity=1)

    async def scenario():
        await create(m, "a")
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(AtCapacity) as info:
            await create(m, "b", wait_s=0.3)
        assert 0.3 <= loop.time() - started < 2
        assert info.value.retry_after >= 1 and "0.3 s" in info.value.message
        assert m.counts()["queued"] == 0 and "b" not in m.records

    asyncio.run(scenario())
    m.threads.shutdown()


@pytest.mark.parametrize("how", ["cancelled", "hung_up"])
def test_a_waiter_that_leaves_holds_no_slot_and_no_entry(tmp_path, how):
    m = manager(tmp_path, capacity=1)

    async def scenario():
        await create(m, "a")
        gone = asyncio.Event()

        async def hangup():
            await gone.wait()

        first = asyncio.ensure_future(create(m, "leaver", wait_s=30, hangup=hangup))
        second = asyncio.ensure_future(create(m, "stayer", wait_s=30))
        await until(lambda: m.admission.counts()["queued"] == 2)
        if how == "cancelled":
            first.cancel()
        else:
            gone.set()
        with pytest.raises((asyncio.CancelledError, AtCapacity)):
            await first
        assert m.admission.counts()["queued"] == 1
        await m.close("a")
        assert (await second)["episode_id"] == "stayer"  # the slot skipped the leaver
        assert "leaver" not in m.records and m.admission.counts()["queued"] == 0
        assert m.admission._granted == 0

    asyncio.run(scenario())
    m.threads.shutdown()


def test_a_waiter_cancelled_as_it_is_granted_passes_the_slot_on(tmp_path):
    m = manager(tmp_path, capacity=1)

    async def scenario():
        await create(m, "a")
        first = asyncio.ensure_future(create(m, "x", wait_s=30))
        second = asyncio.ensure_future(create(m, "y", wait_s=30))
        await until(lambda: m.admission.counts()["queued"] == 2)
        await m.close("a")  # grants the slot to x ...
        first.cancel()      # ... which is cancelled before it resumes
        await asyncio.gather(first, return_exceptions=True)
        assert (await second)["episode_id"] == "y"
        assert m.active() == 1 and m.admission._granted == 0

    asyncio.run(scenario())
    m.threads.shutdown()


def test_shutdown_refuses_the_waiters(tmp_path):
    m = manager(tmp_path, capacity=1)

    async def scenario():
        await create(m, "a")
        waiter = asyncio.ensure_future(create(m, "b", wait_s=30))
        await until(lambda: m.admission.counts()["queued"] == 1)
        await m.shutdown()
        with pytest.raises(Unavailable):
            await waiter

    asyncio.run(scenario())


@pytest.mark.parametrize("value", [-1, 601, "5", True, None, float("nan")])
def test_bad_wait_s_is_a_typed_400(value):
    with pytest.raises(BadRequest) as info:
        wire.parse(wire.CreateEpisode, {"wait_s": value}, "body")
    assert info.value.http_status == 400 and "wait_s" in info.value.message
    assert wire.parse(wire.CreateEpisode, {"wait_s": 600}, "body").wait_s == 600.0
    assert wire.CREATE_SCHEMA["properties"]["wait_s"]["maximum"] == wire.WAIT_MAX_S


def test_over_http_the_line_is_in_metadata_and_an_expired_wait_has_retry_after(counter_service):
    svc = counter_service(capacity=1)
    client = Client(svc.url)
    assert client.metadata()["admission"] == {"queued": 0, "queue_bound": 4}
    first = client.create()["episode_id"]
    assert svc.config["queue_bound"] == 4
    with pytest.raises(ClientAtCapacity) as info:
        client.request("POST", "/episodes", {"wait_s": 0.5})
    assert info.value.status == 429 and info.value.retry_after >= 1
    with pytest.raises(ServiceError) as bad:
        client.request("POST", "/episodes", {"wait_s": 1e9})
    assert bad.value.status == 400 and bad.value.name == "bad_request"
    listing = client.request("GET", "/episodes")[1]
    assert listing["queued"] == 0 and listing["queue_bound"] == 4
    # the client's wait is the server's: a slot freed during it is taken
    import threading
    threading.Timer(0.5, lambda: Client(svc.url).close(first)).start()
    assert client.create(wait=20)["episode_id"] != first
    [record] = [r for r in svc.outcomes() if r["episode_id"] == first]
    assert record["status"] == "closed"
    json.dumps(listing)


def test_a_queued_client_that_hangs_up_leaves_the_line_at_once(counter_service):
    import socket
    import time

    svc = counter_service(capacity=1)
    client = Client(svc.url)
    client.create()
    host, port = svc.url.removeprefix("http://").split(":")
    body = b'{"wait_s": 60}'
    sock = socket.create_connection((host, int(port)), timeout=10)
    token = session_token().encode()
    sock.sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
                 % (token, len(body), body))
    deadline = time.monotonic() + 10
    while client.metadata()["admission"]["queued"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sock.close()
    hung_up = time.monotonic()
    while client.metadata()["admission"]["queued"] != 0:
        # sooner than the server's own cancellation (gunicorn: 3 s after)
        assert time.monotonic() - hung_up < 2.5
        time.sleep(0.05)
    assert client.request("GET", "/episodes")[1]["active"] == 1


def test_camg_status_shows_the_line_per_service(tmp_path, monkeypatch):
    from camg import status

    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "toy.json").write_text(json.dumps(
        {"environment": "toy", "port": 9, "capacity": 2, "config_hash": "a" * 64}))
    monkeypatch.setattr(status, "systemd_running", lambda: False)
    answers = {"/health": {"status": "healthy", "reasons": [], "episodes": {
        "active": 2, "capacity": 2, "finished": 0, "queued": 3, "queue_bound": 8}},
        "/metadata": {"config_hash": "a" * 64}}
    monkeypatch.setattr(status, "get_json",
                        lambda url, timeout=3.0: (200, answers[url.split(":9", 1)[1]]))
    [row] = [status.environment_row(tmp_path / "prepared" / "toy.json")]
    assert row["episodes"] == "2/2" and row["queue"] == "3/8"
    table = status.render({"environments": [row], "helper": {"unit": "-", "probes": "-"},
                           "leftovers_checked": False, "leftovers": {}, "systemd": False,
                           "problems": []})
    assert "QUEUE" in table and "3/8" in table
