"""The trainer-facing HTTP contract against a real camg.serve process."""

import json
import socket
import time

import pytest

from camg_client import Client, ServiceError
from devtools.harness.auth import headers as auth_headers


@pytest.fixture
def svc(shared_counter_service):
    return shared_counter_service


def raw_request(url: str, data: bytes, method="POST", path="/episodes", headers=None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
    for key, value in {**auth_headers(), **(headers or {})}.items():
        head += f"{key}: {value}\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    status = int(response.split(b" ", 2)[1])
    body = response.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body) if body.strip() else {}


def test_health_metadata_schema(svc):
    client = Client(svc.url)
    health = client.health()
    assert health["status"] == "healthy" and health["environment"] == "counter"
    meta = client.metadata()
    assert meta["environment"] == "counter" and meta["task_count"] == 5
    assert meta["config_hash"] == svc.config["config_hash"]
    assert meta["source_commit"] == svc.config["source_commit"]
    assert meta["task_selection_hash"].startswith("sha256:")
    assert meta["hashes"]["grader"] == "counter-exact-match/1"
    schema = client.schema()
    assert set(schema) >= {"action", "observation", "state"}
    assert schema["action"]["properties"]["operation"]["enum"][0] == "guess"


def test_full_episode_and_outcome_record(counter_service):
    svc = counter_service(limits={"action_timeout_s": 2})
    client = Client(svc.url)
    first = client.create(task_id="task-03")
    assert first["task_id"] == "task-03" and first["done"] is False
    assert first["lease_expires_at"] > time.time()
    eid = first["episode_id"]
    target = 7 * 2 % 100  # task-03 is the second task in manifest order
    assert client.step(eid, {"operation": "guess", "value": 0})["observation"]["text"] == "higher"
    last = client.step(eid, {"operation": "guess", "value": target})
    assert last["done"] is True and last["reward"] == 1.0 and last.get("failure_class") is None
    [record] = svc.outcomes()
    assert record["episode_id"] == eid and record["reward"] == 1.0 and record["steps"] == 2
    assert record["config_hash"] == svc.config["config_hash"]
    assert set(record["timings"]) >= {"reset_s", "steps_s", "grade_s", "wall_s"}
    trajectory = (svc.config_path.parent.parent / "state" / "counter" / "trajectories"
                  / f"{eid}.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in trajectory] == ["reset", "step", "end"]
    # Sticky terminal answer, and a step after done is a clear 409.
    with pytest.raises(ServiceError) as info:
        client.step(eid, {"operation": "guess", "value": 1})
    assert info.value.status == 409 and info.value.name == "episode_done"
    assert info.value.body["details"]["terminal"]["reward"] == 1.0
    assert client.get(eid)["status"] == "done"
    assert client.close(eid)["status"] == "closed"
    assert client.close(eid)["status"] == "closed"  # idempotent
    assert len(svc.outcomes()) == 1


def test_finish_without_solving_earns_zero(svc):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    result = client.step(eid, {"operation": "finish"})
    assert result["done"] and result["reward"] == 0.0


def test_request_id_replays_without_running_twice(svc):
    client = Client(svc.url)
    eid = client.create(task_id="task-04")["episode_id"]
    one = client.step(eid, {"operation": "guess", "value": 1}, request_id="r-1")
    two = client.step(eid, {"operation": "guess", "value": 1}, request_id="r-1")
    assert one == two and one["step"] == 1
    assert client.get(eid)["environment_state"]["guesses"] == 1
    assert client.step(eid, {"operation": "guess", "value": 1}, request_id="r-2")["step"] == 2


def test_task_selection_by_seed_and_order(counter_service):
    svc = counter_service(limits={"action_timeout_s": 2})
    client = Client(svc.url)
    ids = [client.create()["task_id"] for _ in range(3)]
    assert ids == ["task-04", "task-03", "task-02"]  # manifest order, unsorted
    for eid in [e["episode_id"] for e in client.list()["episodes"]]:
        client.close(eid)
    assert client.create(seed=6)["task_id"] == client.create(seed=6)["task_id"]
    with pytest.raises(ServiceError) as info:
        client.create(task_id="nope")
    assert info.value.status == 404 and info.value.name == "task_not_found"


def test_capacity_gives_429_with_retry_after(counter_service):
    svc = counter_service(capacity=2)
    client = Client(svc.url)
    a = client.create()["episode_id"]
    client.create()
    with pytest.raises(ServiceError) as info:
        client.create()
    assert info.value.status == 429 and info.value.retry_after >= 1
    client.close(a)
    client.create()


@pytest.mark.parametrize("body, status, name", [
    (b"{not json", 400, "bad_request"),
    (b'{"action": {"operation": "guess", "value": 1}, "extra": 1}', 400, "bad_request"),
    (b'{"action": "guess"}', 400, "bad_request"),
    (b'{"action": {"operation": "fly"}}', 422, "invalid_action"),
    (b'{"action": {"operation": "guess", "value": "7"}}', 422, "invalid_action"),
    (b'{"action": {"operation": "guess"}}', 422, "invalid_action"),
    (b'{"action": {}, "request_id": 5}', 400, "bad_request"),
    (b'[]', 400, "bad_request"),
])
def test_bad_steps_change_nothing(svc, body, status, name):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    got, reply = raw_request(svc.url, body, path=f"/episodes/{eid}/step")
    assert (got, reply["error"]) == (status, name), reply
    assert reply["message"]
    state = client.get(eid)
    assert state["step_count"] == 0 and state["status"] == "running"
    assert client.step(eid, {"operation": "guess", "value": 1})["step"] == 1


def test_bad_creates_and_unknown_ids(svc):
    assert raw_request(svc.url, b'{"seed": -1}')[0] == 400
    assert raw_request(svc.url, b'{"seed": "1"}')[0] == 400
    assert raw_request(svc.url, b'{"episode_id": "../x"}')[0] == 400
    assert raw_request(svc.url, b'{"task": "x"}')[0] == 400
    assert raw_request(svc.url, b"x" * (2 << 20))[0] == 413
    assert raw_request(svc.url, b"", method="GET", path="/episodes/nope")[0] == 404
    assert raw_request(svc.url, b"", method="DELETE", path="/episodes/nope")[0] == 404
    assert raw_request(svc.url, b"{}", path="/episodes/nope/step")[0] in (400, 404)
    assert raw_request(svc.url, b"", method="GET", path="/nothing")[0] == 404
    client = Client(svc.url)
    client.create(episode_id="mine-1")
    with pytest.raises(ServiceError) as info:
        client.create(episode_id="mine-1")
    assert info.value.status == 409


def test_action_deadline_gives_null_reward_timeout(counter_service):
    svc = counter_service(limits={"action_timeout_s": 2})
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    started = time.monotonic()
    result = client.step(eid, {"operation": "sleep", "seconds": 30})
    assert time.monotonic() - started < 10
    assert result["done"] and result["reward"] is None and result["failure_class"] == "timeout"
    assert svc.outcomes()[-1]["failure_class"] == "timeout"


@pytest.mark.parametrize("action, failure", [
    ({"operation": "crash"}, "sandbox_died"),
    ({"operation": "boom"}, "infra"),
])
def test_infrastructure_failures_are_never_a_zero(svc, action, failure):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    result = client.step(eid, action)
    assert result["done"] and result["reward"] is None and result["failure_class"] == failure
    assert [o for o in svc.outcomes() if o["episode_id"] == eid][0]["failure_class"] == failure


def test_grader_and_reset_failures(counter_service):
    svc = counter_service(tasks=[{"task_id": "g", "data": {"target": 1, "grade_fails": True}},
                                 {"task_id": "r", "data": {"target": 1, "reset_fails": True}}])
    client = Client(svc.url)
    eid = client.create(task_id="g")["episode_id"]
    result = client.step(eid, {"operation": "guess", "value": 1})
    assert result["reward"] is None and result["failure_class"] == "grader_error"
    with pytest.raises(ServiceError) as info:
        client.create(task_id="r")
    assert info.value.status == 503 and info.value.body["failure_class"] == "sandbox_died"
    assert [o["failure_class"] for o in svc.outcomes()] == ["grader_error", "sandbox_died"]
    assert client.health()["episodes"]["active"] == 0


def test_a_reset_refused_at_capacity_below_is_a_429_not_an_infra_failure(counter_service):
    """A gate below the service (the helper's container starts, General's
    boots) that runs out during a reset: the trainer gets 429 with the gate's
    Retry-After and may retry; the slot is free and the record says why."""
    svc = counter_service(tasks=[{"task_id": "full", "data": {"target": 1, "reset_at_capacity": True}},
                                 {"task_id": "ok", "data": {"target": 1}}], capacity=1)
    client = Client(svc.url)
    with pytest.raises(ServiceError) as info:
        client.create(task_id="full")
    assert info.value.status == 429 and info.value.retry_after == 7.0
    assert info.value.name == "at_capacity" and info.value.body["details"]["task_id"] == "full"
    [record] = svc.outcomes()
    assert record["reward"] is None and record["failure_class"] == "infra"
    assert record["reason"].startswith("reset refused at capacity")
    assert client.create(task_id="ok")["task_id"] == "ok"  # the one slot is free again
    assert "Traceback" not in svc.output()


def test_idle_lease_is_reaped(counter_service):
    svc = counter_service(limits={"idle_ttl_s": 0.5})
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    time.sleep(2)
    assert client.get(eid)["status"] == "closed"
    assert svc.outcomes()[-1]["reason"] == "lease expired"


def test_disconnect_mid_step_loses_nothing(svc):
    client = Client(svc.url)
    eid = client.create(task_id="task-04")["episode_id"]
    body = json.dumps({"action": {"operation": "sleep", "seconds": 0.5}, "request_id": "slow"}).encode()
    host, port = svc.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    token = auth_headers()["Authorization"]
    sock.sendall(f"POST /episodes/{eid}/step HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                 f"\r\nAuthorization: {token}\r\n\r\n".encode() + body)
    sock.close()  # hang up before the answer
    time.sleep(1.0)
    replay = client.step(eid, {"operation": "sleep", "seconds": 0.5}, request_id="slow")
    assert replay["step"] == 1 and replay["observation"]["text"] == "slept"
    assert client.get(eid)["step_count"] == 1


def test_concurrent_step_on_one_episode_is_refused(svc):
    import threading
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    thread = threading.Thread(target=lambda: Client(svc.url).step(
        eid, {"operation": "sleep", "seconds": 1}))
    thread.start()
    time.sleep(0.3)
    with pytest.raises(ServiceError) as info:
        client.step(eid, {"operation": "guess", "value": 1})
    assert info.value.status == 409 and info.value.name == "episode_busy"
    thread.join()


def test_graceful_shutdown_closes_every_episode(counter_service):
    svc = counter_service()
    client = Client(svc.url)
    ids = {client.create()["episode_id"] for _ in range(3)}
    client.close_connection()
    assert svc.stop() == 0
    closed = {o["episode_id"] for o in svc.outcomes() if o["reason"] == "service stopping"}
    assert closed == ids


# -- a DELETE that arrives while the episode is being created (issue 11, defect 2)

class _GatedEpisode:
    """Blocks in reset until released or closed; counts its closes."""

    def __init__(self, log: list) -> None:
        import threading
        self.release = threading.Event()
        self.log = log
        self.closes = 0

    def reset(self):
        self.log.append("reset")
        if not self.release.wait(10):
            raise AssertionError("never released")
        return {"text": "ready"}

    def step(self, action):
        raise AssertionError("a closed episode must not step")

    def grade(self):
        return 0.0

    def close(self):
        self.closes += 1
        self.release.set()  # a close aborts a reset, as Coding's does

    def state(self):
        return {}

    def outcome(self):
        return {}


def _gated_manager(tmp_path, gate: str):
    """An EpisodeManager whose environment blocks in ``gate``."""
    import threading
    from camg.config.service_config import Limits
    from camg.environment import Task
    from camg.episodes.manager import EpisodeManager
    from camg.episodes.outcomes import OutcomeLog

    class Env:
        name = "gated"
        action_schema = {"type": "object"}
        tasks = [Task("t", {})]

        def __init__(self):
            self.created, self.log, self.in_create = [], [], threading.Event()
            self.go = threading.Event()

        def create_episode(self, task, *, seed, episode_id):
            if gate == "create":
                self.in_create.set()
                assert self.go.wait(10)
            episode = _GatedEpisode(self.log)
            if gate == "create":
                episode.release.set()
            self.created.append(episode)
            return episode

    env = Env()
    manager = EpisodeManager(env, capacity=2, limits=Limits(), config_hash="h",
                             outcomes=OutcomeLog(tmp_path))
    return manager, env


@pytest.mark.parametrize("gate", ["create", "reset"])
def test_close_during_creation_is_not_lost(tmp_path, gate):
    import asyncio
    from camg.web import http_wire as wire
    from camg.errors import EpisodeDone

    manager, env = _gated_manager(tmp_path, gate)

    async def scenario():
        creating = asyncio.ensure_future(manager.create(wire.CreateEpisode(episode_id="e1")))
        while not (env.in_create.is_set() or env.log):
            await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(manager.close("e1"))
        await asyncio.sleep(0.1)
        env.go.set()  # creation (if that is where it waits) may now finish
        closed = await closing
        with pytest.raises(EpisodeDone) as info:
            await creating
        return closed, info.value

    closed, refused = asyncio.run(scenario())
    assert closed["status"] == "closed"
    assert refused.details["terminal"]["done"] is True
    # Not listed as running, counted as nothing, and its episode closed once.
    assert manager.list() == [] and manager.active() == 0
    assert manager.state("e1")["status"] == "closed"
    [episode] = env.created
    assert episode.closes == 1
    assert env.log == ([] if gate == "create" else ["reset"])
    records = [json.loads(line) for line in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    assert [(r["episode_id"], r["status"], r["reward"]) for r in records] == [("e1", "closed", None)]
    manager.threads.shutdown()


def test_listing_episodes_does_not_renew_their_leases(counter_service):
    """Polling GET /episodes (a monitor, `camg status`) kept abandoned
    episodes alive forever; only touching one episode renews its lease."""
    svc = counter_service(limits={"idle_ttl_s": 1.0})
    client = Client(svc.url)
    abandoned = client.create()["episode_id"]
    kept = client.create()["episode_id"]
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and client.list()["active"] == 2:
        client.get(kept)
        time.sleep(0.1)
    assert client.get(abandoned)["status"] == "closed"
    assert client.get(abandoned)["failure_class"] == "timeout"
    assert client.get(kept)["status"] == "running"
    # The reaper closes the episode, then appends its record: on a loaded
    # machine the status can be read between the two.
    deadline = time.monotonic() + 10
    while not svc.outcomes() and time.monotonic() < deadline:
        time.sleep(0.05)
    [record] = svc.outcomes()
    assert record["episode_id"] == abandoned and record["reason"] == "lease expired"


def test_default_capacity_is_derived_from_what_the_helper_holds(tmp_path):
    """No capacity in the deployment: what one peer's sandbox ceiling holds at
    the environment's sandboxes per episode, capped (issue 17)."""
    from camg import helper_wire, plugins
    from tests.support.services import configure_counter
    config = json.loads(configure_counter(tmp_path, capacity=None).read_text())
    assert config["capacity"] == plugins.default_capacity(None)
    coding = plugins.all_plugins()["coding"]
    assert coding.sandboxes_per_episode == 2
    # on a host with cores and memory to spare (the cases: test_capacity_formula)
    roomy = plugins.Host(cores=64, memory_bytes=1 << 40)
    assert plugins.default_capacity(coding, roomy) == helper_wire.SANDBOXES_PER_PEER // 2 == 256
    import dataclasses
    greedy = dataclasses.replace(coding, sandboxes_per_episode=8)
    assert plugins.default_capacity(greedy, roomy) == helper_wire.SANDBOXES_PER_PEER // 8
