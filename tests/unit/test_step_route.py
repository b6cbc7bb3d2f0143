"""The step route answered ahead of falcon (camg/web/step_route.py) against
falcon's own answer of the same request, side by side.

A trailing slash sends a step to falcon's ``app.EpisodeStep`` (the app
strips it), so every case is asked both ways of a real camg.serve process
over raw sockets: status, headers (but Date) and body must be the same.
"""

import json
import socket
import threading
import time

import pytest

from camg_client import Client
from devtools.harness.auth import session_token

ACTION = {"operation": "guess", "value": 0}


def auth_line() -> str:
    """The session token's header line, for the raw requests."""
    return f"Authorization: Bearer {session_token()}\r\n"


@pytest.fixture
def svc(shared_counter_service):
    return shared_counter_service


def exchange(url: str, path: str, body: bytes, extra: str = "") -> tuple[int, dict, bytes]:
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"{auth_line()}{extra}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    if reply.startswith(b"HTTP/1.1 100 "):  # the interim answer to an Expect
        reply = reply.partition(b"\r\n\r\n")[2]
    raw_head, _, payload = reply.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    headers.pop("date", None)
    return int(lines[0].split()[1]), headers, payload


def both(url: str, episode_id: str, body: bytes) -> tuple[tuple, tuple]:
    """(the step route's answer, falcon's answer) of the same request."""
    return (exchange(url, f"/episodes/{episode_id}/step", body),
            exchange(url, f"/episodes/{episode_id}/step/", body))


def test_a_step_is_answered_as_falcon_answers_it(svc):
    client = Client(svc.url)
    fast_eid = client.create(task_id="task-01")["episode_id"]
    slow_eid = client.create(task_id="task-01")["episode_id"]
    body = json.dumps({"action": ACTION}).encode()
    fast = exchange(svc.url, f"/episodes/{fast_eid}/step", body)
    slow = exchange(svc.url, f"/episodes/{slow_eid}/step/", body)
    assert fast[0] == slow[0] == 200
    assert fast[1] == slow[1] == {"content-type": "application/json",
                                  "content-length": str(len(fast[2])), "connection": "close"}
    answer, expected = json.loads(fast[2]), json.loads(slow[2])
    assert answer.pop("episode_id") == fast_eid and expected.pop("episode_id") == slow_eid
    assert answer == expected and answer["step"] == 1 and answer["done"] is False
    # Both steps are the episode's own: recorded, counted, retried by request id.
    with_id = json.dumps({"action": ACTION, "request_id": "r-1"}).encode()
    first = exchange(svc.url, f"/episodes/{fast_eid}/step", with_id)
    assert exchange(svc.url, f"/episodes/{fast_eid}/step", with_id) == first
    assert client.get(fast_eid)["step_count"] == 2
    for eid in (fast_eid, slow_eid):
        client.close(eid)


@pytest.mark.parametrize("body", [
    b"{bad",                                               # not JSON: 400
    b"[]",                                                 # not an object: 400
    json.dumps({"action": ACTION, "extra": 1}).encode(),   # unknown field: 400
    json.dumps({"request_id": "x"}).encode(),              # no action: 400
    json.dumps({"action": {"operation": "fly"}}).encode(),  # off the action schema: 422
    json.dumps({"action": ACTION, "request_id": ""}).encode(),
], ids=["not-json", "not-object", "unknown-field", "no-action", "invalid-action", "empty-request-id"])
def test_refusals_are_falcons_refusals(svc, body):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    fast, slow = both(svc.url, eid, body)
    assert fast == slow and fast[0] in (400, 422), fast
    assert client.get(eid)["step_count"] == 0  # nothing was run
    client.close(eid)


def test_unknown_and_finished_episodes(svc):
    body = json.dumps({"action": ACTION}).encode()
    fast, slow = both(svc.url, "no-such-episode", body)
    assert fast == slow and fast[0] == 404
    assert json.loads(fast[2])["error"] == "episode_not_found"
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    client.step(eid, {"operation": "finish"})
    fast, slow = both(svc.url, eid, body)
    assert fast == slow and fast[0] == 409
    refusal = json.loads(fast[2])
    assert refusal["error"] == "episode_done" and refusal["details"]["terminal"]["done"] is True


def test_a_busy_episode_is_refused_the_same_way(svc):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    sleeper = threading.Thread(target=Client(svc.url).step,  # a connection of its own
                               args=(eid, {"operation": "sleep", "seconds": 1.5}))
    sleeper.start()
    try:
        # An action off the schema changes nothing: 422 while the episode is
        # idle, 409 once the sleep runs (the busy check comes first).
        body = json.dumps({"action": {"operation": "fly"}}).encode()
        deadline = time.monotonic() + 10
        while exchange(svc.url, f"/episodes/{eid}/step", body)[0] != 409:
            assert time.monotonic() < deadline, "the sleep step never started"
            time.sleep(0.01)
        fast, slow = both(svc.url, eid, body)
        assert fast == slow and fast[0] == 409
        assert json.loads(fast[2])["error"] == "episode_busy"
    finally:
        sleeper.join()
        client.close(eid)


def test_other_forms_of_the_route_still_reach_falcon(svc):
    """Chunked bodies, an Expect header and other methods are falcon's."""
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    host, port = svc.url.removeprefix("http://").split(":")
    body = json.dumps({"action": ACTION}).encode()
    chunked = (f"POST /episodes/{eid}/step HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               f"{auth_line()}Connection: close\r\n\r\n{len(body):x}\r\n").encode() + body \
        + b"\r\n0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(chunked)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and b'"step":1' in reply
    status, headers, _ = exchange(svc.url, f"/episodes/{eid}/step", body, "Expect: 100-continue\r\n")
    assert status == 200
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET /episodes/{eid}/step HTTP/1.1\r\nHost: x\r\n{auth_line()}"
                     f"Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 405") and b"allow: post" in reply.lower()
    assert client.get(eid)["step_count"] == 2
    client.close(eid)


def test_an_oversized_body_is_refused_before_it_is_read(svc):
    """Over the body limit goes to falcon, which answers 413 (and drains)."""
    limit = svc.config["limits"]["max_body_bytes"]
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    body = json.dumps({"action": {**ACTION, "pad": "x" * limit}}).encode()
    status, _, payload = exchange(svc.url, f"/episodes/{eid}/step", body)
    assert status == 413 and json.loads(payload)["error"] == "payload_too_large"
    assert client.get(eid)["step_count"] == 0
    client.close(eid)
