"""The synchronous client's own HTTP/1.1 connection (camg_client/transport.py):
one write per request, and every response shape a server may send, read
right or refused by name (a raw socket server plays the odd ones), and the
real service end to end."""

from __future__ import annotations

import socket
import threading

import pytest

from camg_client import Client, NotFound
from camg_client.transport import (Connection, ConnectionDropped, IncompleteResponse,
                                   ProtocolError)


class RawServer:
    """Accepts one connection at a time; for each request read (head and
    Content-Length body) sends the next canned reply; records the bytes of
    each recv so tests can see how a request arrived."""

    def __init__(self, replies: list[bytes], close_after: bool = False) -> None:
        self.replies = list(replies)
        self.close_after = close_after
        self.recvs: list[bytes] = []
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.replies:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while self.replies:
                    data = conn.recv(65536)
                    if not data:
                        break
                    self.recvs.append(data)
                    buf += data
                    if b"\r\n\r\n" not in buf:
                        continue
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(rest) < length:
                        continue
                    self.requests.append(head + b"\r\n\r\n" + rest[:length])
                    buf = rest[length:]
                    conn.sendall(self.replies.pop(0))
                    if self.close_after:
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw():
    servers = []

    def make(*replies: bytes, close_after: bool = False) -> RawServer:
        servers.append(RawServer(list(replies), close_after))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": 1234}"


def test_head_and_body_leave_in_one_write_and_keep_alive_reuses_the_socket(raw):
    server = raw(OK, OK)
    conn = Connection("127.0.0.1", server.port, 5)
    first = conn.request("POST", "/episodes/e/step", b'{"action": {}}')
    second = conn.request("GET", "/health")
    assert first.status == second.status == 200 and first.body == b'{"a": 1234}'
    assert first.getheader("Content-Type") == "application/json"
    # one recv held the whole first request: head and body came together
    assert server.recvs[0] == server.requests[0]
    assert server.requests[0].startswith(b"POST /episodes/e/step HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 14\r\n" in server.requests[0]
    assert b"Content-Length" not in server.requests[1]
    assert len(server.requests) == 2          # both on the one accepted connection
    conn.close()


def test_chunked_body_with_extensions_and_trailers(raw):
    reply = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    server = raw(reply, OK)
    conn = Connection("127.0.0.1", server.port, 5)
    assert conn.request("GET", "/x").body == b"hello world"
    assert conn.request("GET", "/y").body == b'{"a": 1234}'   # nothing left over
    conn.close()


def test_body_until_close_and_connection_close_reopen(raw):
    server = raw(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", OK, close_after=True)
    conn = Connection("127.0.0.1", server.port, 5)
    response = conn.request("GET", "/x")
    assert response.body == b"until the end" and response.getheader("connection") == "close"
    assert conn.request("GET", "/y").status == 200     # a new connection, transparently
    conn.close()


def test_no_body_statuses_and_repeated_headers(raw):
    server = raw(b"HTTP/1.1 204 No Content\r\nVary: a\r\nVary: b\r\n\r\n", OK)
    conn = Connection("127.0.0.1", server.port, 5)
    response = conn.request("DELETE", "/episodes/e")
    assert response.status == 204 and response.body == b""
    assert response.getheader("vary") == "a, b"
    assert conn.request("GET", "/y").body == b'{"a": 1234}'
    conn.close()


@pytest.mark.parametrize("reply, error", [
    (b"", ConnectionDropped),
    (b"HTTP/1.1 200 OK\r\nContent-Le", IncompleteResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", IncompleteResponse),
    (b"SSH-2.0-OpenSSH\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", ProtocolError),
])
def test_a_bad_or_cut_response_is_named_and_closes_the_connection(raw, reply, error):
    server = raw(reply, close_after=True)
    conn = Connection("127.0.0.1", server.port, 5)
    with pytest.raises(error):
        conn.request("GET", "/x")
    assert conn._sock is None and not conn._buf


def test_a_dropped_connection_is_a_connection_error_the_client_retries(raw):
    # The first connection is closed without a reply; a GET is retry-safe.
    server = raw(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 22\r\n\r\n{\"status\": \"healthy\"}\n",
                 close_after=True)
    assert Client(f"http://127.0.0.1:{server.port}").health() == {"status": "healthy"}
    assert len(server.requests) == 2


def test_a_response_head_past_the_limit_is_refused(raw):
    server = raw(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", close_after=True)
    with pytest.raises(ProtocolError, match="head exceeds"):
        Connection("127.0.0.1", server.port, 5).request("GET", "/x")


@pytest.mark.parametrize("path", ["/episodes/a b/step", "/episodes/x\r\nX-Injected: 1/step",
                                  "/episodes/\x00", "/episodes/é", "/episodes/\U0001f600"])
def test_a_target_that_would_break_the_request_line_is_refused_before_sending(raw, path):
    server = raw(OK)
    conn = Connection("127.0.0.1", server.port, 5)
    with pytest.raises(ValueError, match="request target"):
        conn.request("GET", path)
    assert conn._sock is None and server.recvs == []   # nothing was sent, nothing opened
    with pytest.raises(ValueError):
        Client(f"http://127.0.0.1:{server.port}").step("x\r\nX-Injected: 1", {})


def test_the_real_service_through_the_client(counter_service):
    client = Client(counter_service().url)
    eid = client.create()["episode_id"]
    assert client.step(eid, {"operation": "guess", "value": -1})["step"] == 1
    with pytest.raises(NotFound) as missing:
        client.step("nobody", {"operation": "guess", "value": 1})
    assert missing.value.status == 404
    client.close(eid)
    assert client.get(eid)["status"] != "running"
