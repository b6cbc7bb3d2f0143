"""One keep-alive HTTP/1.1 connection: the synchronous ``Client``'s wire.

Why not ``http.client``: it writes a request's head and its body in two
``send`` calls, so the service wakes twice per step (the parser sees the
head, then the body), and it parses every response head through
``email.feedparser``. On a loopback step of the counter environment those
two cost more than the service's whole HTTP server (bench/bench_http.py
measures both clients in the same run). Here a request is one ``sendall``
of head and body, TCP_NODELAY is on (the request is complete, nothing is
worth waiting for), and a response is read into one buffer and parsed with
``bytes`` methods.

What it speaks is what the services answer: HTTP/1.1 with Content-Length
or chunked bodies, or a body that ends when the server closes (HTTP/1.0,
``Connection: close``). A connection the server closed before a response
began raises ``ConnectionDropped`` (a ``ConnectionError``, so the client's
retry of retry-safe requests applies, as for http.client's
RemoteDisconnected); one closed mid-response raises ``IncompleteResponse``,
also a ``ConnectionError``. Anything else malformed is ``ProtocolError``
and closes the connection: nothing is read into the next response.
"""

from __future__ import annotations

import re
import socket

#: a response head larger than this is refused (http.client's line limit is
#: 64 KiB per line, 100 headers)
MAX_HEAD = 1 << 16
_RECV = 1 << 16
_NO_BODY = (204, 304)
# What may not appear in a request target: a space or a control character
# would end the request line early or start a header of the caller's making
# (http.client refuses them too, as InvalidURL).
_BAD_TARGET = re.compile(r"[^\x21-\x7e]")
_BAD_HEADER = re.compile(r"[\x00-\x1f\x7f]")


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x this client can read."""


class ConnectionDropped(ConnectionError):
    """The server closed the connection before its response began."""


class IncompleteResponse(ConnectionError):
    """The server closed the connection part way through a response."""


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


class Connection:
    """Requests one at a time over one socket, opened on first use."""

    def __init__(
        self, host: str, port: int, timeout: float | None, headers: dict[str, str] | None = None
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._host_header = f"{host}:{port}".encode("ascii")
        #: sent with every request (the trainer's Authorization)
        self._extra = []
        for name, value in (headers or {}).items():
            if _BAD_HEADER.search(name + value) or not name or ":" in name:
                raise ValueError(f"not a header an HTTP/1.1 request can carry: {name!r}")
            self._extra.append(f"{name}: {value}".encode("latin-1"))
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Response:
        if _BAD_TARGET.search(path) or _BAD_TARGET.search(method):
            raise ValueError(f"not a request target an HTTP/1.1 request line can carry: {path!r}")
        head = [
            f"{method} {path} HTTP/1.1".encode("ascii"),
            b"Host: " + self._host_header,
            *self._extra,
        ]
        if body is not None:
            head.append(b"Content-Type: " + content_type.encode("ascii"))
            head.append(b"Content-Length: " + str(len(body)).encode("ascii"))
        elif method in ("POST", "PUT", "PATCH"):
            head.append(b"Content-Length: 0")
        message = b"\r\n".join(head) + b"\r\n\r\n" + (body or b"")
        if self._sock is None:
            self._connect()
        assert self._sock is not None  # _connect set it or raised
        try:
            self._sock.sendall(message)
            response = self._read_response(method)
        except BaseException:
            self.close()
            raise
        if response.headers.get("connection", "").lower() == "close":
            self.close()
        return response

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buf.clear()
        if sock is not None:
            sock.close()

    # -- internals -------------------------------------------------------
    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def _fill(self) -> bool:
        """Read more into the buffer; False at the server's end of stream."""
        assert self._sock is not None  # only read from within request(), connected
        chunk = self._sock.recv(_RECV)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def _read_response(self, method: str) -> Response:
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                break
            if len(buf) >= MAX_HEAD + 4:
                raise ProtocolError(f"response head exceeds {MAX_HEAD} bytes")
            if not self._fill():
                if buf:
                    raise IncompleteResponse("connection closed inside the response head")
                raise ConnectionDropped("the server closed the connection without a response")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[: end + 4]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"malformed response header line {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            # Repeated fields are one comma-joined value (RFC 9110 5.3).
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        if method == "HEAD" or status in _NO_BODY or 100 <= status < 200:
            return Response(status, headers, b"")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return Response(status, headers, self._read_chunked())
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length!r}")
            return Response(status, headers, self._read_exactly(int(length)))
        # No length: the body is everything until the server closes.
        while self._fill():
            pass
        body = bytes(buf)
        buf.clear()
        headers["connection"] = "close"
        return Response(status, headers, body)

    def _read_exactly(self, n: int) -> bytes:
        buf = self._buf
        while len(buf) < n:
            if not self._fill():
                raise IncompleteResponse(f"connection closed after {len(buf)} of {n} body bytes")
        body = bytes(buf[:n])
        del buf[:n]
        return body

    def _read_line(self) -> bytes:
        buf = self._buf
        while True:
            end = buf.find(b"\r\n")
            if end >= 0:
                line = bytes(buf[:end])
                del buf[: end + 2]
                return line
            if len(buf) > MAX_HEAD:
                raise ProtocolError("chunk size line too long")
            if not self._fill():
                raise IncompleteResponse("connection closed inside a chunked body")

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_field = self._read_line().split(b";", 1)[0].strip()
            if not size_field or size_field.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"bad chunk size {size_field[:20]!r}")
            size = int(size_field, 16)
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._read_exactly(size))
            if self._read_exactly(2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
