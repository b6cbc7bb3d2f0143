"""Slow and many peers against the listeners any local user can reach: a
service's HTTP port (limits.header_timeout_s, body_timeout_s,
max_connections; camg.serving.http_worker.bounded_protocol) and the helper's
metrics port (camg.metrics.ScrapeServer). Each must drop the slow peer in
the documented time, keep answering everyone else, and stay healthy."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import socket
import threading
import time
import urllib.request

import pytest
import websockets
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from camg.metrics import HelperMetrics, ScrapeServer
from camg.config.service_config import Limits
from camg_client import Client
from devtools.harness.auth import headers as auth_headers, session_token
from devtools.harness.services import free_port

HEADER_S, BODY_S = 1.0, 1.5


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.conftest import _service_starter, _stop_all
    started: list = []
    yield _service_starter(tmp_path_factory.mktemp("slow"), started)(
        limits={"header_timeout_s": HEADER_S, "body_timeout_s": BODY_S,
                "max_connections": 64, "action_timeout_s": 30}, capacity=8)
    _stop_all(started)


def _auth() -> bytes:
    """The token's header line: without it the gate answers 401 at the head,
    before the body deadlines these requests are about."""
    return b"Authorization: Bearer %s\r\n" % session_token().encode()


def _connect(url: str) -> socket.socket:
    client = Client(url)
    return socket.create_connection((client.host, client.port), timeout=30)


def _until_closed(sock: socket.socket, limit_s: float = 30.0) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and when."""
    t0, got = time.monotonic(), b""
    sock.settimeout(limit_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk


def test_slow_and_trickled_headers_get_408_and_are_closed(svc):
    silent = _connect(svc.url)  # connects and sends nothing
    partial = _connect(svc.url)
    partial.sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\n")
    trickle = _connect(svc.url)
    t0 = time.monotonic()

    def drip():
        # a byte at a time, faster than the timeout: arriving data must not
        # move the deadline
        for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            try:
                trickle.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.05)
    threading.Thread(target=drip, daemon=True).start()
    for sock in (silent, partial, trickle):
        got, _ = _until_closed(sock)
        took = time.monotonic() - t0
        sock.close()
        assert got.startswith(b"HTTP/1.1 408 "), got[:100]
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
        assert HEADER_S * 0.8 <= took <= HEADER_S + 10, took
    assert Client(svc.url).health()["status"] == "healthy"


@pytest.mark.parametrize("route", ["step", "step/", "create"])
def test_a_slow_body_is_closed_and_changes_nothing(svc, route):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    path = "/episodes" if route == "create" else f"/episodes/{eid}/{route}"
    before = len(client.list()["episodes"])
    body = json.dumps({"action": {"operation": "guess", "value": 1}}).encode()
    sock = _connect(svc.url)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), _auth(), len(body),
                                                      body[:10]))
    got, took = _until_closed(sock)
    sock.close()
    assert b"200 OK" not in got and b"201 Created" not in got, got[:200]
    assert BODY_S * 0.8 <= took <= BODY_S + 10, took
    assert client.get(eid)["step_count"] == 0
    assert len(client.list()["episodes"]) == before
    client.close(eid)


def test_kept_alive_connections_get_a_fresh_head_deadline_per_request(svc):
    client = Client(svc.url)
    conn = http.client.HTTPConnection(client.host, client.port, timeout=30)
    for _ in range(3):  # whole requests spaced under the timeout are served
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["status"] == "healthy"
        sock = conn.sock
        time.sleep(HEADER_S * 0.6)
    assert conn.sock is sock  # one connection, kept alive
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # then a head that never ends
    got, took = _until_closed(sock)
    sock.close()
    assert b"408 Request Timeout" in got and took <= HEADER_S + 10


def test_answering_and_websockets_have_no_read_deadline(svc):
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    t0 = time.monotonic()
    # a step that takes longer than both timeouts is answered in full
    reply = client.step(eid, {"operation": "sleep", "seconds": HEADER_S + BODY_S + 0.5})
    assert time.monotonic() - t0 >= HEADER_S + BODY_S and "observation" in reply
    client.close(eid)

    async def idle_websocket():
        async with websockets.connect(svc.url.replace("http", "ws") + "/ws",
                                      additional_headers=auth_headers()) as ws:
            await asyncio.sleep(HEADER_S + BODY_S + 0.5)
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
    asyncio.run(idle_websocket())


def _health_on_new_connection(url: str) -> bytes:
    sock = _connect(url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got, _ = _until_closed(sock)
    sock.close()
    return got


def test_a_head_beyond_64_kib_is_a_431_and_a_large_body_is_not(svc):
    sock = _connect(svc.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
    try:
        for _ in range(1024):  # 8 MiB of one header, sent faster than the deadline
            sock.sendall(b"a" * 8192)
    except OSError:
        pass  # closed on us mid-send: the refusal
    got, took = _until_closed(sock)
    sock.close()
    assert got.startswith(b"HTTP/1.1 431 "), got[:100]
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "headers_too_large"
    assert took < HEADER_S  # refused at the size, not at the deadline
    # a body near max_body_bytes in one write is no head
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    status, data = _raw_post(svc.url, f"/episodes/{eid}/step", json.dumps(
        {"action": {"operation": "guess", "value": 1}, "request_id": "r" * 255,
         "pad": "x" * 900_000}).encode())
    assert status == 400 and b"pad" in data, data[:200]  # parsed: refused for its field
    client.close(eid)


def _raw_post(url: str, path: str, raw: bytes):
    client = Client(url)
    conn = http.client.HTTPConnection(client.host, client.port, timeout=30)
    try:
        conn.request("POST", path, body=raw,
                     headers={"Content-Type": "application/json", **auth_headers()})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("stalls", ["head", "body", "kept-alive"])
def test_slow_or_idle_peers_never_fill_the_connection_table(svc, stalls):
    # three times the bound, each stalled in its head (no byte at all), its
    # body, or kept alive after a whole request: each new one beyond the
    # bound drops the oldest of those
    idle = []
    for _ in range(192):
        idle.append(_connect(svc.url))
        if stalls == "body":
            idle[-1].sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                             + _auth() + b"\r\n{")
        elif stalls == "kept-alive":
            idle[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert idle[-1].recv(65536).startswith(b"HTTP/1.1 200 ")
    try:
        time.sleep(0.2)
        got = _health_on_new_connection(svc.url)
        assert got.startswith(b"HTTP/1.1 200 "), got[:100]
        for s in idle[:100]:
            # long before the read deadlines (and the keep-alive timeout)
            got = _until_closed(s, HEADER_S * 0.9)[0]
            if stalls == "head":
                assert got.startswith(b"HTTP/1.1 408 "), got[:100]
            else:
                assert b"HTTP/1.1 20" not in got, got[:100]
    finally:
        for s in idle:
            s.close()
    assert Client(svc.url).health()["status"] == "healthy"


def test_with_every_connection_answering_one_more_request_is_a_json_503(counter_service):
    svc = counter_service(limits={"max_connections": 4, "action_timeout_s": 30}, capacity=4)
    client = Client(svc.url)
    episodes = [client.create()["episode_id"] for _ in range(4)]
    client.close_connection()
    steps = [threading.Thread(target=lambda eid=eid: Client(svc.url).step(
        eid, {"operation": "sleep", "seconds": 2})) for eid in episodes]
    for thread in steps:
        thread.start()
    time.sleep(1)  # four requests being answered: nothing to displace
    got = _health_on_new_connection(svc.url)
    assert got.startswith(b"HTTP/1.1 503 "), got[:100]
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "overloaded"
    assert b"retry-after: 1" in got.lower()
    for thread in steps:
        thread.join(30)
    assert client.health()["status"] == "healthy"
    assert all(client.get(eid)["step_count"] == 1 for eid in episodes)


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/episodes", "/episodes/{eid}/step", "/reset", "/mcp",
                              "/episodes/{eid}/fork"]),
       cut=st.floats(0, 0.999), junk=st.binary(max_size=20))
def test_fuzz_requests_cut_anywhere_are_dropped_and_change_nothing(svc, route, cut, junk):
    """A whole request cut at any byte (plus a few stray ones) and left
    there: 408 while in its head, closed while in its body, never run."""
    client = Client(svc.url)
    eid = client.create()["episode_id"]
    before = len(client.list()["episodes"])
    body = json.dumps({"action": {"operation": "guess", "value": 1}}).encode()
    request = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"%sContent-Length: %d\r\n\r\n%s" % (route.format(eid=eid).encode(), _auth(),
                                                      len(body) + len(junk), body + junk))
    head = request.index(b"\r\n\r\n") + 4
    sent = request[:int(cut * len(request))]
    sock = _connect(svc.url)
    sock.sendall(sent)
    got, took = _until_closed(sock)
    sock.close()
    if len(sent) < head and not got.startswith(b"HTTP/1.1 400 "):  # httptools may refuse junk
        assert got.startswith(b"HTTP/1.1 408 "), (sent, got[:100])
        assert took <= HEADER_S + 10
    elif len(sent) >= head:
        assert got == b"", (sent, got[:100])
        assert took <= BODY_S + 10
    assert client.get(eid)["step_count"] == 0
    assert len(client.list()["episodes"]) == before
    client.close(eid)
    assert client.health()["status"] == "healthy"


@pytest.mark.parametrize("field,value", [("header_timeout_s", 0), ("header_timeout_s", math.nan),
                                         ("body_timeout_s", 3601), ("body_timeout_s", -1),
                                         ("max_connections", 0), ("max_connections", 70000)])
def test_limits_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


# -- the helper's metrics port ------------------------------------------------
def _threads() -> int:
    return threading.active_count()


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_flood_of_slow_connections_leaves_the_metrics_port_answering(monkeypatch):
    monkeypatch.setattr(ScrapeServer, "READ_TIMEOUT_S", 2.0)
    metrics = HelperMetrics()
    metrics.watch(sandboxes=lambda: 3, containers=lambda: 0, probes_ok=lambda: True)
    port = free_port()
    stop = metrics.serve(port)
    try:
        threads = _threads()
        flood = []
        for i in range(1000):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.send(b"GET /metr" if i % 2 else b"")
            flood.append(sock)
            if i % 250 == 0:
                # answered during the flood, and no thread per connection
                assert _scrape(port)["camg_helper_sandboxes_live"] == 3
                assert _threads() == threads
        # everything the flood opened is dropped: evicted as the oldest
        # reader, or at the read timeout
        for sock in flood:
            assert _until_closed(sock, 30)[0] == b""
            sock.close()
        assert _threads() == threads
        assert _scrape(port)["camg_helper_probes_ok"] == 1
    finally:
        stop()
    assert _threads() == threads - 1  # the loop's own thread ends with it


def test_metrics_port_refuses_what_is_no_scrape(monkeypatch):
    monkeypatch.setattr(ScrapeServer, "READ_TIMEOUT_S", 1.0)
    metrics = HelperMetrics()
    port = free_port()
    stop = metrics.serve(port)
    try:
        for request, status in [(b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
                                (b"GET /other HTTP/1.1\r\n\r\n", b"404"),
                                (b"HEAD /metrics HTTP/1.1\r\n\r\n", b"200"),
                                (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000, b""),
                                (b"GET /metrics HTTP/1.1\r\n", b"")]:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(request)
            got, took = _until_closed(sock)
            sock.close()
            assert got[9:12] == status, (request[:30], got[:60])
            assert took < 10
        assert "camg_helper_probes_ok" in _scrape(port)
    finally:
        stop()
