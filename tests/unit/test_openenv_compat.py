"""The stock openenv-core client drives a camg service; so do the plain
OpenEnv HTTP endpoints."""

import asyncio
import json

import pytest
import websockets
from openenv.core import GenericEnvClient

from camg.client import Client


def test_stock_openenv_client_runs_a_whole_episode(counter_service):
    svc = counter_service()
    with GenericEnvClient(base_url=svc.url).sync() as env:
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
        async with websockets.connect(svc.url.replace("http", "ws") + "/ws") as ws:
            for message, code in [("{bad", "INVALID_JSON"), (json.dumps({"type": "fly"}), "UNKNOWN_TYPE"),
                                  (json.dumps({"type": "step", "data": {"operation": "guess"}}),
                                   "EXECUTION_ERROR"),
                                  (json.dumps({"type": "reset", "data": {"bogus": 1}}), "VALIDATION_ERROR")]:
                await ws.send(message)
                reply = json.loads(await ws.recv())
                assert reply["type"] == "error" and reply["data"]["code"] == code, reply
            await ws.send(json.dumps({"type": "reset", "data": {"episode_id": "ws-1"}}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "observation" and reply["data"]["episode_id"] == "ws-1"
            await ws.send(json.dumps({"type": "step", "data": {"operation": "fly"}}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["data"]["error"] == "invalid_action"
        # Hanging up closes the session's episode.
    asyncio.run(scenario())
    client = Client(svc.url)
    for _ in range(50):
        if client.get("ws-1")["status"] == "closed":
            break
        asyncio.run(asyncio.sleep(0.05))
    assert client.get("ws-1")["status"] == "closed"
    assert svc.outcomes()[-1]["status"] == "closed"


def test_http_reset_step_state(counter_service):
    svc = counter_service()
    client = Client(svc.url)
    status, reset = client.request("POST", "/reset", {"task_id": "task-04", "seed": 3})
    assert status == 200 and reset["done"] is False and reset["reward"] is None
    eid = reset["episode_id"]
    _, step = client.request("POST", "/step", {"action": {"operation": "guess", "value": 7}})
    assert step["done"] is True and step["reward"] == 1.0 and step["episode_id"] == eid
    _, state = client.request("GET", f"/state?episode_id={eid}")
    assert state["status"] == "done"
    _, state = client.request("GET", "/state")
    assert state["episode_id"] == eid
    with pytest.raises(Exception):
        client.request("POST", "/step", {"action": {"operation": "guess", "value": 1},
                                         "episode_id": "missing"})
