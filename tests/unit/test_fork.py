"""POST /episodes/{id}/fork (camg/episodes/forking.py) over real HTTP: a camg.serve of
the framework's counter environment, whose fork copies its guesses. Route
semantics, every refusal, the child's record, trajectory, signature,
regrade, lease and metrics, and both clients' fork()."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from camg import verify
from camg.episodes import forking
from camg.episodes.outcomes import OutcomeLog
from camg_client import AsyncClient, Client
from camg_client import client as client_mod
from tests.support.services import ServiceProcess, configure_counter, counter_tasks
from devtools.harness.auth import headers as auth_headers

# counter_tasks(): task-04 is the first listed, target 7; task-03 target 14
TASKS = counter_tasks() + [
    {"task_id": "refuses", "data": {"target": 5, "fork_refused": True}},
    {"task_id": "fails", "data": {"target": 5, "fork_fails": True}},
    {"task_id": "slow", "data": {"target": 5, "fork_sleep": 1.5}},
    {"task_id": "full", "data": {"target": 5, "fork_at_capacity": True}},
]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    config = configure_counter(tmp_path_factory.mktemp("fork"), tasks=TASKS, capacity=16,
                               limits={"max_steps": 6})
    service = ServiceProcess(config).wait_ready()
    yield service
    service.stop(signal.SIGINT)


def records_of(svc, episode_id):
    return [r for r in svc.outcomes() if r["episode_id"] == episode_id]


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


def test_child_continues_from_the_parent_and_both_go_on_alone(svc):
    client = Client(svc.url)
    parent = client.create(task_id="task-03")["episode_id"]
    latest = client.step(parent, {"operation": "guess", "value": 50})["observation"]
    status, headers, child = post(svc.url, f"/episodes/{parent}/fork", b"")
    assert status == 201 and headers["location"] == f"/episodes/{child['episode_id']}"
    assert child["forked_from"] == parent and child["fork_step"] == 1
    assert child["task_id"] == "task-03" and child["observation"] == latest == {
        "text": "lower", "task_id": "task-03"}
    assert child["reward"] is None and child["done"] is False
    assert child["lease_expires_at"] > time.time()
    cid = child["episode_id"]
    state = client.get(cid)
    assert state["status"] == "running" and state["step_count"] == 1
    assert state["forked_from"] == parent and state["fork_step"] == 1
    assert state["environment_state"] == {"guesses": 1}  # the parent's guess came along
    # different actions, each path's own reward
    won = client.step(cid, {"operation": "guess", "value": 14})
    assert won["done"] and won["reward"] == 1.0 and won["step"] == 2
    assert client.get(parent)["status"] == "running"  # the child's end is not the parent's
    lost = client.step(parent, {"operation": "finish"})
    assert lost["reward"] == 0.0 and lost["step"] == 2
    [child_record] = records_of(svc, cid)
    [parent_record] = records_of(svc, parent)
    assert child_record["forked_from"] == parent and child_record["fork_step"] == 1
    assert child_record["reward"] == 1.0 and child_record["steps"] == 2
    assert child_record["task_id"] == "task-03" and child_record["cost"]["phases"]["reset_s"] >= 0
    assert "forked_from" not in parent_record and parent_record["reward"] == 0.0
    assert child_record["seq"] != parent_record["seq"]
    assert won["outcome_seq"] == child_record["seq"]


def test_the_childs_trajectory_names_the_parent_and_joins_its_prefix(svc):
    client = Client(svc.url)
    parent = client.create(task_id="task-03")["episode_id"]
    client.step(parent, {"operation": "guess", "value": 50})
    client.step(parent, {"operation": "guess", "value": 20})
    child = client.fork(parent)["episode_id"]
    grandchild = client.fork(child, child_id=f"{child}-g")["episode_id"]
    client.step(parent, {"operation": "guess", "value": 1})  # after the fork: not the child's
    client.step(grandchild, {"operation": "guess", "value": 14})
    for eid in (child, parent):
        client.close(eid)
    log = OutcomeLog(Path(svc.config["state_dir"]))
    own = log._entries(grandchild)
    assert own[0]["event"] == "fork" and own[0]["forked_from"] == child
    assert own[0]["fork_step"] == 2 and own[0]["observation"]["text"] == "lower"
    whole = forking.trajectory(log, grandchild)
    assert [e["event"] for e in whole] == ["reset", "step", "step", "fork", "fork", "end"]
    assert [e.get("action", {}).get("value") for e in whole if e["event"] != "fork"] == [
        None, 50, 20, 14]
    assert forking.trajectory(log, parent) == log._entries(parent)  # no parent: its own file
    log.close()


def test_records_of_forks_verify_and_their_fork_fields_are_signed(svc, tmp_path):
    client = Client(svc.url)
    parent = client.create(task_id="task-02")["episode_id"]
    child = client.fork(parent)["episode_id"]
    client.step(child, {"operation": "finish"})
    client.close(parent)
    path = Path(svc.config["state_dir"]) / "outcomes.jsonl"
    assert verify.main([str(path)]) == 0
    lines = path.read_bytes().splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if json.loads(line)["episode_id"] == child)
    for change in ({"fork_step": 3}, {"forked_from": "someone-else"}, None):
        record = json.loads(lines[number])
        if change is None:
            del record["forked_from"], record["fork_step"]  # a fork passed off as a straight run
        else:
            record.update(change)
        tampered = tmp_path / "outcomes.jsonl"
        edited = list(lines)
        edited[number] = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        tampered.write_bytes(b"".join(edited))
        (tmp_path / "outcomes.pub").write_bytes((path.parent / "outcomes.pub").read_bytes())
        failures = verify.check(tampered.read_bytes().splitlines(keepends=True),
                                __import__("camg.episodes.signing").episodes.signing.load_public(
                                    tmp_path / "outcomes.pub"))
        assert any(n == number + 1 and "changed after signing" in why for n, why in failures)
    # and a straight run's record that claims to be a fork fails too
    straight = next(i for i, line in enumerate(lines)
                    if "forked_from" not in json.loads(line))
    record = json.loads(lines[straight])
    record.update(forked_from="x", fork_step=1)
    from camg.episodes import signing
    assert signing.problem(record, signing.load_public(path.parent / "outcomes.pub"))


def test_refusals(svc):
    client = Client(svc.url)
    with pytest.raises(client_mod.NotFound) as info:
        client.fork("nobody")
    assert info.value.name == "episode_not_found"
    parent = client.create(task_id="task-01")["episode_id"]
    with pytest.raises(client_mod.EpisodeExists):
        client.fork(parent, child_id=parent)
    done = client.create(task_id="task-01")["episode_id"]
    client.step(done, {"operation": "finish"})
    with pytest.raises(client_mod.EpisodeExists):
        client.fork(parent, child_id=done)  # a finished episode's id is taken too
    with pytest.raises(client_mod.EpisodeDone) as info:
        client.fork(done)
    assert info.value.body["details"]["terminal"]["done"] is True
    # bad bodies: a typed 400 naming the field
    for body in (b'{"episode_id": "no spaces"}', b'{"child": "x"}', b'{"wait_s": -1}', b"[1"):
        status, _, answer = post(svc.url, f"/episodes/{parent}/fork", body)
        assert status == 400 and answer["error"] == "bad_request", body
    # a step in flight: 409 at once, not a wait
    stepping = threading.Thread(target=Client(svc.url).step,
                                args=(parent, {"operation": "sleep", "seconds": 1.0}))
    stepping.start()
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(client_mod.EpisodeBusy):
        client.fork(parent)
    assert time.monotonic() - started < 0.5
    stepping.join()
    client.close(parent)
    client.close(done)


def test_a_fork_in_flight_holds_the_parents_step_lock(svc):
    client = Client(svc.url)
    parent = client.create(task_id="slow")["episode_id"]
    forked: dict = {}
    thread = threading.Thread(target=lambda: forked.update(Client(svc.url).fork(parent)))
    thread.start()
    time.sleep(0.4)
    with pytest.raises(client_mod.EpisodeBusy):
        client.step(parent, {"operation": "guess", "value": 1})
    with pytest.raises(client_mod.EpisodeBusy):
        client.fork(parent)
    thread.join()
    assert forked["forked_from"] == parent
    # the lock is released afterwards
    assert client.step(parent, {"operation": "guess", "value": 1})["done"] is False
    client.close(forked["episode_id"])
    client.close(parent)


def test_a_fork_past_its_deadline_keeps_the_parent_locked_until_it_returns(counter_service):
    service = counter_service(tasks=TASKS, limits={"reset_timeout_s": 0.5})
    client = Client(service.url)
    parent = client.create(task_id="slow")["episode_id"]  # its fork takes 1.5 s
    with pytest.raises(client_mod.Unavailable) as info:
        client.fork(parent, child_id="late")
    assert info.value.failure_class == "timeout"
    [record] = [r for r in service.outcomes() if r["episode_id"] == "late"]
    assert record["reward"] is None and record["failure_class"] == "timeout"
    assert record["forked_from"] == parent
    # the environment is still copying: no step may change the parent under it
    with pytest.raises(client_mod.EpisodeBusy):
        client.step(parent, {"operation": "guess", "value": 1})
    time.sleep(1.3)
    assert client.step(parent, {"operation": "guess", "value": 1})["done"] is False
    assert "late" not in {e["episode_id"] for e in client.list()["episodes"]}


def test_not_forkable_names_what_and_leaves_nothing(svc):
    client = Client(svc.url)
    parent = client.create(task_id="refuses")["episode_id"]
    active = client.list()["active"]
    with pytest.raises(client_mod.NotForkable) as info:
        client.fork(parent, child_id="never-made")
    assert info.value.status == 409 and info.value.body["details"]["what"] == "secret"
    assert client.list()["active"] == active
    with pytest.raises(client_mod.NotFound):
        client.get("never-made")
    assert not records_of(svc, "never-made")
    trajectories = Path(svc.config["state_dir"]) / "trajectories"
    assert not list(trajectories.glob("never-made.*"))  # no file, no open marker
    assert client.step(parent, {"operation": "finish"})["done"]  # the parent is unharmed


def test_a_gate_below_at_capacity_is_a_429_and_leaves_nothing(svc):
    client = Client(svc.url)
    parent = client.create(task_id="full")["episode_id"]
    active = client.list()["active"]
    with pytest.raises(client_mod.AtCapacity) as info:
        client.fork(parent, child_id="no-slot-child")
    assert info.value.status == 429 and info.value.retry_after == 7.0
    assert client.list()["active"] == active and not records_of(svc, "no-slot-child")
    assert client.step(parent, {"operation": "finish"})["done"]  # the parent is unharmed


def test_a_failed_fork_is_a_failed_reset_of_the_child_reward_null(svc):
    client = Client(svc.url)
    parent = client.create(task_id="fails")["episode_id"]
    with pytest.raises(client_mod.Unavailable) as info:
        client.fork(parent, child_id="broken-child")
    assert info.value.status == 503 and info.value.failure_class == "sandbox_died"
    [record] = records_of(svc, "broken-child")
    assert record["reward"] is None and record["failure_class"] == "sandbox_died"
    assert record["forked_from"] == parent and record["fork_step"] == 0
    assert client.get(parent)["status"] == "running"
    client.close(parent)


def test_the_child_inherits_the_step_budget_and_regrades(svc):
    client = Client(svc.url)
    parent = client.create(task_id="task-03")["episode_id"]
    for value in (1, 2, 3, 4):
        client.step(parent, {"operation": "guess", "value": value})
    child = client.fork(parent)["episode_id"]
    client.step(child, {"operation": "guess", "value": 5})
    last = client.step(child, {"operation": "guess", "value": 14})  # step 6 = max_steps
    assert last["done"] and last["step"] == 6 and last["reward"] == 1.0
    # max_steps counts the whole path: the parent has 2 steps left, not a fresh 6
    client.step(parent, {"operation": "guess", "value": 5})
    assert client.step(parent, {"operation": "guess", "value": 6})["done"]
    answer = client.regrade(child)
    assert answer["reward"] == 1.0 and answer["same_grader"] is True
    assert answer["regrade_of"]["reward"] == 1.0 and answer["regraded_guesses"] == 6


def test_parent_closed_first_and_fork_chains_go_on(svc):
    client = Client(svc.url)
    parent = client.create(task_id="task-03")["episode_id"]
    a = client.fork(parent)["episode_id"]
    client.close(parent)
    b = client.fork(a)["episode_id"]
    c = client.fork(b)["episode_id"]
    assert client.get(c)["forked_from"] == b
    assert client.step(c, {"operation": "guess", "value": 14})["reward"] == 1.0
    assert client.step(a, {"operation": "finish"})["reward"] == 0.0
    client.close(b)
    assert [records_of(svc, e)[0]["status"] for e in (parent, a, b, c)] == [
        "closed", "done", "closed", "done"]


def test_children_count_against_capacity_and_may_wait(tmp_path):
    config = configure_counter(tmp_path, capacity=2, limits={"idle_ttl_s": 1.0})
    service = ServiceProcess(config).wait_ready()
    try:
        client = Client(service.url)
        parent = client.create()["episode_id"]
        child = client.fork(parent)["episode_id"]
        with pytest.raises(client_mod.AtCapacity) as info:
            client.fork(parent)
        assert info.value.status == 429 and info.value.retry_after >= 1
        with pytest.raises(client_mod.AtCapacity):
            client.create()

        def close_later():
            time.sleep(0.4)
            Client(service.url).close(child)
        threading.Thread(target=close_later).start()
        started = time.monotonic()
        waited = client.fork(parent, wait=10)  # queued: the closed child's slot is its
        assert 0.3 < time.monotonic() - started < 5 and waited["forked_from"] == parent
        # an abandoned child is reaped by its own lease, the parent kept alive
        deadline = time.monotonic() + 10
        # (GET /episodes renews no lease; GET /episodes/{parent} renews the parent's)
        while waited["episode_id"] in {e["episode_id"] for e in client.list()["episodes"]}:
            client.get(parent)
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert client.get(parent)["status"] == "running"
        [reaped] = [r for r in service.outcomes() if r["episode_id"] == waited["episode_id"]]
        assert reaped["reason"] == "lease expired" and reaped["failure_class"] == "timeout"
        metrics = urllib_get(f"{service.url}/metrics")
        assert 'camg_episodes_started_total{environment="counter",task_kind="none"} 3.0' in metrics
    finally:
        service.stop(signal.SIGINT)


def urllib_get(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_schema_describes_the_route(svc):
    schema = Client(svc.url).schema()
    assert set(schema["fork_request"]["properties"]) == {"episode_id", "wait_s"}
    assert {"forked_from", "fork_step", "observation"} <= set(schema["fork_response"]["required"])
    assert "forked_from" in schema["state"]["properties"]


def test_async_client_fork(svc):
    async def scenario():
        async with AsyncClient(svc.url) as client:
            parent = (await client.create(task_id="task-03"))["episode_id"]
            child = await client.fork(parent, child_id=f"{parent}-async")
            assert child["episode_id"] == f"{parent}-async" and child["fork_step"] == 0
            with pytest.raises(client_mod.EpisodeExists):
                await client.fork(parent, child_id=f"{parent}-async")
            answer = await client.step(child["episode_id"], {"operation": "guess", "value": 14})
            assert answer["reward"] == 1.0
            await client.close(parent)
    asyncio.run(scenario())


def test_a_child_left_running_by_a_killed_service_is_recorded_as_a_fork(tmp_path):
    # what the manager writes for a child (camg/episodes/forking.py), then the
    # service dies: its next start records the child with its lineage
    log = OutcomeLog(tmp_path)
    log.trajectory("kid", {"event": "fork", "task_id": "task-03", "seed": 4,
                           "forked_from": "mum", "fork_step": 2, "observation": {}})
    log.trajectory("kid", {"event": "step", "step": 3, "action": {}, "observation": {}})
    log.close()
    restarted = OutcomeLog(tmp_path)
    assert restarted.recover("counter", "sha256:c") == ["kid"]
    [record] = restarted.read()
    assert (record["task_id"], record["seed"], record["forked_from"], record["fork_step"]) == (
        "task-03", 4, "mum", 2)
    assert record["reward"] is None and record["failure_class"] == "infra" and record["recovered"]
    assert record["steps"] == 3  # 2 before the fork, 1 after
    restarted.close()
