"""POST /episodes with ``group: N`` (camg/episodes/forking.py, a GRPO group) over real
HTTP: a camg.serve of the framework's counter environment. One reset and
N-1 forks of it, all slots or none, a failing fork closes the whole group,
and a create without ``group`` answers exactly as before."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import threading
import time

import pytest

from camg.web import http_wire as wire
from camg_client import AsyncClient, Client
from camg_client import client as client_mod
from tests.support.services import ServiceProcess, configure_counter, counter_tasks
from devtools.harness.auth import headers as auth_headers

# counter_tasks(): task-03's target is 14
TASKS = counter_tasks() + [
    {"task_id": "refuses", "data": {"target": 5, "fork_refused": True}},
    {"task_id": "fails", "data": {"target": 5, "fork_fails": True}},
    {"task_id": "full", "data": {"target": 5, "fork_at_capacity": True}},
]
CAPACITY = 12


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    config = configure_counter(tmp_path_factory.mktemp("group"), tasks=TASKS,
                               capacity=CAPACITY, limits={"max_steps": 6})
    service = ServiceProcess(config).wait_ready()
    yield service
    service.stop(signal.SIGINT)


def post(url: str, path: str, body: bytes) -> tuple[int, dict, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", **auth_headers()})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"null")
    finally:
        conn.close()


def records_of(svc, episode_id):
    return [r for r in svc.outcomes() if r["episode_id"] == episode_id]


def test_a_group_of_8_is_one_reset_and_7_independent_forks(svc):
    client = Client(svc.url)
    before = client.list()["active"]
    status, headers, body = post(svc.url, "/episodes",
                                 json.dumps({"task_id": "task-03", "seed": 9,
                                             "group": 8}).encode())
    assert status == 201 and list(body) == ["group"]
    group = body["group"]
    ids = [e["episode_id"] for e in group]
    assert len(group) == 8 and len(set(ids)) == 8
    first = ids[0]
    assert headers["location"] == f"/episodes/{first}"
    assert {e["task_id"] for e in group} == {"task-03"}
    assert all(e["observation"] == group[0]["observation"] and e["reward"] is None
               and e["done"] is False for e in group)
    assert "forked_from" not in group[0]
    assert all(e["forked_from"] == first and e["fork_step"] == 0 for e in group[1:])
    assert client.list()["active"] == before + 8
    states = [client.get(eid) for eid in ids]
    assert {s["seed"] for s in states} == {9} and {s["step_count"] for s in states} == {0}
    # each path its own: one guesses right, one gives up, the rest go on untouched
    won = client.step(ids[3], {"operation": "guess", "value": 14})
    assert won["done"] and won["reward"] == 1.0 and won["step"] == 1
    lost = client.step(ids[5], {"operation": "finish"})
    assert lost["done"] and lost["reward"] == 0.0
    assert client.step(first, {"operation": "guess", "value": 50})["observation"]["text"] == "lower"
    assert client.get(ids[1])["environment_state"] == {"guesses": 0}
    for eid in ids:
        if client.get(eid)["status"] == "running":
            client.close(eid)
    [won_record] = records_of(svc, ids[3])
    assert won_record["forked_from"] == first and won_record["fork_step"] == 0
    assert won_record["reward"] == 1.0 and won_record["seed"] == 9
    assert "forked_from" not in records_of(svc, first)[0]
    assert client.list()["active"] == before


def test_a_group_larger_than_the_free_slots_is_all_or_nothing(svc):
    client = Client(svc.url)
    held = [client.create(task_id="task-03")["episode_id"] for _ in range(CAPACITY - 5)]
    try:
        active = client.list()["active"]
        assert CAPACITY - active == 5
        known = {r["episode_id"] for r in svc.outcomes()}
        with pytest.raises(client_mod.AtCapacity) as info:
            client.create(task_id="task-03", group=6)
        assert info.value.status == 429 and info.value.retry_after >= 1
        # nothing created, no slot held, no record written
        assert client.list()["active"] == active
        assert {e["episode_id"] for e in client.list()["episodes"]} == set(held)
        assert {r["episode_id"] for r in svc.outcomes()} == known
        # the 5 that are free are a group of 5, at once
        group = client.create(task_id="task-03", group=5)
        assert len(group) == 5 and client.list()["active"] == CAPACITY
        for episode in group:
            client.close(episode["episode_id"])
    finally:
        for eid in held:
            client.close(eid)


def test_a_waiting_group_holds_the_slots_it_gets_until_it_has_them_all(svc):
    client = Client(svc.url)
    held = [client.create(task_id="task-03")["episode_id"] for _ in range(CAPACITY - 2)]
    answer: dict = {}

    def gather():
        try:
            answer["group"] = Client(svc.url).create(task_id="task-03", group=4, wait=20)
        except Exception as exc:  # surfaced by the assertion below
            answer["error"] = exc
    waiter = threading.Thread(target=gather)
    try:
        waiter.start()
        wait_for(lambda: client.list()["active"] == CAPACITY or answer)
        assert client.list()["active"] == CAPACITY, answer  # the 2 free are held
        assert not answer
        with pytest.raises(client_mod.AtCapacity):  # a create behind it finds none
            client.create(task_id="task-03")
        client.close(held.pop())
        assert not answer
        client.close(held.pop())
        waiter.join(20)
        group = answer["group"]
        assert len(group) == 4 and all(e["forked_from"] == group[0]["episode_id"]
                                       for e in group[1:])
        for episode in group:
            client.close(episode["episode_id"])
    finally:
        waiter.join(20)
        for eid in held:
            client.close(eid)


def test_a_wait_that_runs_out_frees_every_slot_it_held(svc):
    client = Client(svc.url)
    held = [client.create(task_id="task-03")["episode_id"] for _ in range(CAPACITY - 2)]
    known = {r["episode_id"] for r in svc.outcomes()}
    try:
        status, _, body = post(svc.url, "/episodes", json.dumps(
            {"task_id": "task-03", "group": 3, "wait_s": 0.5}).encode())
        assert status == 429 and body["error"] == "at_capacity"
        assert client.list()["active"] == CAPACITY - 2
        assert {e["episode_id"] for e in client.list()["episodes"]} == set(held)
        assert {r["episode_id"] for r in svc.outcomes()} == known
        # the 2 it held are free to the next create
        assert len(client.create(task_id="task-03", group=2)) == 2
    finally:
        for state in client.list()["episodes"]:
            client.close(state["episode_id"])


def test_a_trainer_that_hangs_up_while_its_group_gathers_leaves_no_slot_held(svc):
    client = Client(svc.url)
    held = [client.create(task_id="task-03")["episode_id"] for _ in range(CAPACITY - 2)]
    host, port = svc.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/episodes", body=json.dumps(
            {"task_id": "task-03", "group": 4, "wait_s": 60}),
            headers={"Content-Type": "application/json", **auth_headers()})
        wait_for(lambda: client.list()["active"] == CAPACITY)
        conn.close()  # the trainer is gone
        wait_for(lambda: client.list()["active"] == CAPACITY - 2)
        assert {e["episode_id"] for e in client.list()["episodes"]} == set(held)
        assert len(client.create(task_id="task-03", group=2)) == 2  # nobody holds them
    finally:
        conn.close()
        for state in client.list()["episodes"]:
            client.close(state["episode_id"])


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_a_failing_fork_closes_the_whole_group(svc):
    client = Client(svc.url)
    before = {r["episode_id"] for r in svc.outcomes()}
    active = client.list()["active"]
    with pytest.raises(client_mod.Unavailable) as info:
        client.create(task_id="fails", group=4)
    assert info.value.status == 503 and info.value.failure_class == "sandbox_died"
    assert client.list()["active"] == active  # every slot free again
    new = [r for r in svc.outcomes() if r["episode_id"] not in before]
    # the reset first (closed with its group, reward null) and the fork that failed;
    # the two forks never tried left nothing
    assert sorted((r["status"], r["reward"], r.get("failure_class")) for r in new) == [
        ("closed", None, None), ("done", None, "sandbox_died")]
    first = next(r for r in new if r["status"] == "closed")
    assert "closed with its group" in first["reason"]
    assert next(r for r in new if r["status"] == "done")["forked_from"] == first["episode_id"]


def test_a_refused_or_gated_fork_answers_its_error_and_closes_the_first(svc):
    client = Client(svc.url)
    active = client.list()["active"]
    with pytest.raises(client_mod.NotForkable) as refused:
        client.create(task_id="refuses", group=3)
    assert refused.value.status == 409
    with pytest.raises(client_mod.AtCapacity) as gated:
        client.create(task_id="full", group=2)
    assert gated.value.retry_after == 7.0
    assert client.list()["active"] == active


@pytest.mark.parametrize("body", [
    {"group": wire.GROUP_MAX + 1}, {"group": 0}, {"group": -3}, {"group": True},
    {"group": "8"}, {"group": 2.5}, {"group": 2, "episode_id": "mine"},
    {"group": CAPACITY + 1},
])
def test_a_group_out_of_bounds_is_a_400_and_creates_nothing(svc, body):
    active = Client(svc.url).list()["active"]
    status, _, answer = post(svc.url, "/episodes", json.dumps(body).encode())
    assert status == 400 and answer["error"] == "bad_request", answer
    assert Client(svc.url).list()["active"] == active


def test_a_group_of_one_may_name_its_episode_and_without_group_nothing_changed(svc):
    client = Client(svc.url)
    [one] = client.create(task_id="task-03", episode_id="group-of-one", group=1)
    assert one["episode_id"] == "group-of-one" and "forked_from" not in one
    status, headers, plain = post(svc.url, "/episodes", b'{"task_id": "task-03"}')
    assert status == 201 and headers["location"] == f"/episodes/{plain['episode_id']}"
    assert sorted(plain) == ["done", "episode_id", "lease_expires_at", "observation", "reward",
                             "task_id"]
    assert isinstance(client.create(task_id="task-03"), dict)
    for state in client.list()["episodes"]:
        client.close(state["episode_id"])


def test_the_one_episode_ways_in_refuse_a_group(svc):
    active = Client(svc.url).list()["active"]
    status, _, answer = post(svc.url, "/reset", json.dumps({"group": 2}).encode())
    assert status == 400 and "POST /episodes only" in json.dumps(answer), answer
    host, port = svc.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/mcp", body=json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
            "params": {"task_id": "task-03", "group": 2}}),
            headers={"content-type": "application/json",
                     "accept": "application/json, text/event-stream", **auth_headers()})
        error = json.loads(conn.getresponse().read())["error"]
    finally:
        conn.close()
    assert error["data"]["error"] == "bad_request" and "POST /episodes only" in str(error)
    assert Client(svc.url).list()["active"] == active


def test_the_async_client_creates_a_group(svc):
    async def run():
        async with AsyncClient(svc.url) as client:
            group = await client.create(task_id="task-03", seed=1, group=3)
            for episode in group:
                await client.close(episode["episode_id"])
            return group
    group = asyncio.run(run())
    assert len(group) == 3 and group[1]["forked_from"] == group[0]["episode_id"]


def test_a_null_group_is_a_plain_create_and_the_schema_documents_group(svc):
    status, _, plain = post(svc.url, "/episodes", b'{"group": null}')
    assert status == 201 and "group" not in plain
    Client(svc.url).close(plain["episode_id"])
    schema = json.loads(http_get(svc.url, "/schema"))["create_episode"]
    assert schema["properties"]["group"]["maximum"] == wire.GROUP_MAX


def http_get(url: str, path: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path, headers=auth_headers())
        return conn.getresponse().read()
    finally:
        conn.close()
