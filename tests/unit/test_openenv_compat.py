"""The stock openenv-core client drives a camg service; so do the plain
OpenEnv HTTP endpoints."""

import asyncio
import json

import pytest
import websockets
from openenv.core import GenericEnvClient

from camg_client import Client
from tests.support.token_clients import with_token
from devtools.harness.auth import headers as auth_headers


def test_stock_openenv_client_runs_a_whole_episode(counter_service):
    svc = counter_service()
    with with_token(GenericEnvClient)(base_url=svc.url).sync() as env:
        result = env.reset(task_id="task-04")
        assert result.done is False
        assert "Guess" in result.observation["text"]
        result = env.step({"operation": "guess", "value": 0})
        assert result.observation["text"] == "higher" and result.reward == 0.0
        state = env.state()
        assert state["step_count"] == 1 and state["task_id"] == "task-04"
        result = env.step({"operation": "guess", "value": 7})
        assert result.done is True and result.reward == 1.0
        # Sticky terminal observation after the end, as OpenEnv expects.
        again = env.step({"operation": "guess", "value": 3})
        assert again.done is True and again.reward == 1.0
    [record] = svc.outcomes()
    assert record["reward"] == 1.0 and record["task_id"] == "task-04"


def test_websocket_errors_and_disconnect_close_the_episode(counter_service):
    svc = counter_service()

    async def scenario():
        async with websockets.connect(svc.url.replace("http", "ws") + "/ws",
                                      additional_headers=auth_headers()) as ws:
            for message, code in [("{bad", "INVALID_JSON"), (json.dumps({"type": "fly"}), "UNKNOWN_TYPE"),
                                  (json.dumps({"type": "step", "data": {"operation": "guess"}}),
                                   "EXECUTION_ERROR"),
                                  (json.dumps({"type": "reset", "data": {"bogus": 1}}), "VALIDATION_ERROR")]:
                await ws.send(message)
                reply = json.loads(await ws.recv())
                assert reply["type"] == "error" and reply["data"]["code"] == code, reply
            # openenv BaseMessage is extra="forbid"; step needs data, state takes none
            for message in [{"type": "state", "data": {}}, {"type": "step"},
                            {"type": "reset", "data": {}, "episode_id": "x"}, ["reset"],
                            {"type": "reset", "data": []}]:
                await ws.send(json.dumps(message))
                reply = json.loads(await ws.recv())
                assert reply["type"] == "error", reply
                assert reply["data"]["code"] == "VALIDATION_ERROR", (message, reply)
            await ws.send(json.dumps({"type": "reset", "data": {"episode_id": "ws-1"}}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "observation"
            assert reply["data"].keys() == {"observation", "reward", "done"}
            await ws.send(json.dumps({"type": "state"}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "state" and reply["data"]["episode_id"] == "ws-1"
            await ws.send(json.dumps({"type": "step", "data": {"operation": "fly"}}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["data"]["error"] == "invalid_action"
            # data is always the bare action, even one with a field named
            # "action" (was taken for a wrapper): the environment judges it
            await ws.send(json.dumps({"type": "step", "data": {"action": {"operation": "guess"}}}))
            reply = json.loads(await ws.recv())
            assert reply["data"]["error"] == "invalid_action", reply
            assert "additional" in reply["data"]["message"] or "action" in reply["data"]["message"]
        # Hanging up closes the session's episode.
    asyncio.run(scenario())
    client = Client(svc.url)
    # The state says closed as the close begins; its record is written a
    # moment later (no reply waits for it: the client hung up).
    for _ in range(100):
        if client.get("ws-1")["status"] == "closed" and svc.outcomes():
            break
        asyncio.run(asyncio.sleep(0.05))
    assert client.get("ws-1")["status"] == "closed"
    assert svc.outcomes()[-1]["status"] == "closed"


def test_http_reset_step_state_follow_openenv_messages(counter_service):
    import requests

    svc = counter_service()
    http = requests.Session()
    http.headers.update(auth_headers())
    reset = http.post(svc.url + "/reset", json={"task_id": "task-04", "seed": 3})
    # ResetResponse / StepResponse are extra="forbid" upstream: exactly three keys
    assert reset.status_code == 200 and reset.json().keys() == {"observation", "reward", "done"}
    assert reset.json()["done"] is False and reset.json()["reward"] is None
    eid = reset.headers["X-Camg-Episode-Id"]
    assert http.cookies["camg_openenv_episode"] == eid
    step = http.post(svc.url + "/step", json={"action": {"operation": "guess", "value": 7},
                                               "timeout_s": 30, "request_id": "r1"})
    assert step.json() == {"observation": step.json()["observation"], "reward": 1.0, "done": True}
    state = http.get(svc.url + f"/state?episode_id={eid}").json()
    assert state["status"] == "done" and state["episode_id"] == eid and state["step_count"] == 1
    assert http.get(svc.url + "/state").json()["episode_id"] == eid
    # a client without the cookie addresses the episode by id, or has none
    assert requests.get(svc.url + "/state", headers=auth_headers()).json() == \
        {"episode_id": None, "step_count": 0}
    assert requests.get(svc.url + f"/state?episode_id={eid}",
                        headers=auth_headers()).json()["episode_id"] == eid
    missing = http.post(svc.url + "/step", json={"action": {"operation": "guess", "value": 1},
                                                  "episode_id": "missing"})
    assert missing.status_code == 404 and missing.json()["error"] == "episode_not_found"
    for body, status in [({"action": "guess"}, 400), ({"action": {}, "bogus": 1}, 400),
                         ({"action": {"operation": "guess"}, "timeout_s": 0}, 400), ([], 400)]:
        answer = http.post(svc.url + "/step", json=body)
        assert answer.status_code == status and answer.json()["error"], (body, answer.text)
    bad = http.post(svc.url + "/reset", json={"task": "task-04"})
    assert bad.status_code == 400 and "task" in bad.json()["message"]
    # a reset from the same client replaces its own episode
    again = http.post(svc.url + "/reset", json={"task_id": "task-03"})
    assert again.headers["X-Camg-Episode-Id"] != eid
    assert http.get(svc.url + "/state").json()["task_id"] == "task-03"


def test_two_http_clients_never_close_each_others_episodes(counter_service):
    """Issue 11 defect 3: a second trainer's POST /reset ended the first
    trainer's episode (one session was shared by every HTTP client)."""
    import requests

    svc = counter_service()
    first, second = requests.Session(), requests.Session()
    first.headers.update(auth_headers())
    second.headers.update(auth_headers())
    a = first.post(svc.url + "/reset", json={"task_id": "task-04"})
    assert a.status_code == 200, a.text
    b = second.post(svc.url + "/reset", json={"task_id": "task-03"})
    assert b.status_code == 200, b.text
    # each client steps its own episode, addressed by nothing but its session
    step_a = first.post(svc.url + "/step", json={"action": {"operation": "guess", "value": 0}})
    assert step_a.status_code == 200, step_a.text
    assert step_a.json()["reward"] == 0.0 and step_a.json()["done"] is False
    state_a, state_b = first.get(svc.url + "/state").json(), second.get(svc.url + "/state").json()
    assert state_a["task_id"] == "task-04" and state_a["status"] == "running"
    assert state_a["step_count"] == 1
    assert state_b["task_id"] == "task-03" and state_b["step_count"] == 0
    assert state_a["episode_id"] != state_b["episode_id"]
    # a third client that never reset has no episode to step
    stranger = requests.post(svc.url + "/step", json={"action": {"operation": "guess", "value": 7}},
                             headers=auth_headers())
    assert stranger.status_code in (400, 404, 409, 422)
    step_a = first.post(svc.url + "/step", json={"action": {"operation": "guess", "value": 7}})
    assert step_a.json()["done"] is True and step_a.json()["reward"] == 1.0
    assert second.get(svc.url + "/state").json()["status"] == "running"
    closed = [r for r in svc.outcomes() if r["status"] == "closed"]
    assert closed == []
