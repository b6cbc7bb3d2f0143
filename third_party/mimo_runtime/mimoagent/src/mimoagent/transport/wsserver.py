"""The transport's server: openenv's ``/ws`` protocol on the stdlib alone.

The General service speaks openenv's WebSocket protocol to the transport
(environments/general/channel.py): ``{"type": "reset"|"step"|"state"|"close",
"data": ...}`` in, ``{"type": "observation", "data": {"observation",
"reward", "done"}}``, ``{"type": "state", "data": {...}}`` or ``{"type":
"error", "data": {"message", "code"[, "errors"]}}`` out -- the messages and
error codes of openenv's ``create_app`` (INVALID_JSON, UNKNOWN_TYPE,
VALIDATION_ERROR, EXECUTION_ERROR, CAPACITY_REACHED). openenv's server,
FastAPI and uvicorn cost about 150 MiB of resident memory in every
container for one connection that carries a few hundred small messages, so
this module serves them with a minimal RFC 6455 server instead: one thread
per connection, one live session per container (a second connection is
refused with CAPACITY_REACHED, as ``max_concurrent_envs=1`` did), each
session a fresh environment from the factory. ``GET /health`` answers 200.

Frames: client frames must be masked (RFC 6455 5.1); text messages are
UTF-8, fragmented or not, at most ``max_size`` bytes (a larger one closes
the connection with 1009); pings are answered; binary messages are refused
(1003). Server frames are unmasked, unfragmented.

It listens on a Unix socket only root can reach (listener.py) and serves
only peers whose credentials name root: the agent's uid, in the same
container, can neither connect nor be served.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
from typing import Any, Callable

from mimoagent.transport import listener as listening
from mimoagent.transport.protocol import ActionInvalid

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_HEAD = 16384
_TEXT, _BINARY, _CLOSE, _PING, _PONG, _CONTINUATION = 1, 2, 8, 9, 10, 0


class _Closed(Exception):
    """The peer went away or broke the protocol; ``code`` for our close frame."""

    def __init__(self, code: int | None = None) -> None:
        super().__init__(code)
        self.code = code


class _Connection:
    def __init__(self, sock: socket.socket, max_size: int) -> None:
        self.sock = sock
        self.max_size = max_size
        self.buffer = b""
        self.send_lock = threading.Lock()

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise _Closed()
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read_head(self) -> tuple[str, str, dict[str, str]]:
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > _MAX_HEAD:
                raise _Closed()
            chunk = self.sock.recv(4096)
            if not chunk:
                raise _Closed()
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _Closed()
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return parts[0], parts[1], headers

    def send_raw(self, data: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(data)

    def send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        self.send_raw(header + payload)

    def send_json(self, message: dict) -> None:
        self.send_frame(_TEXT, json.dumps(message).encode("utf-8"))

    def close(self, code: int = 1000) -> None:
        try:
            self.send_frame(_CLOSE, struct.pack("!H", code))
        except OSError:
            pass

    def receive(self) -> str:
        """The next text message; _Closed when the peer closes or errs."""
        parts: list[bytes] = []
        size = 0
        while True:
            first, second = self._read(2)
            fin, opcode = first & 0x80, first & 0x0F
            if first & 0x70 or not second & 0x80:  # reserved bits / an unmasked client frame
                raise _Closed(1002)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            if opcode >= 8 and (length > 125 or not fin):  # control frames: short, whole
                raise _Closed(1002)
            if opcode < 8 and size + length > self.max_size:
                raise _Closed(1009)
            mask = self._read(4)
            payload = _unmask(self._read(length), mask)
            if opcode == _CLOSE:
                raise _Closed(1000)
            if opcode == _PING:
                self.send_frame(_PONG, payload)
                continue
            if opcode == _PONG:
                continue
            if opcode == _BINARY:
                raise _Closed(1003)
            if opcode not in (_TEXT, _CONTINUATION) or (opcode == _CONTINUATION) != bool(parts):
                raise _Closed(1002)
            parts.append(payload)
            size += length
            if fin:
                try:
                    return b"".join(parts).decode("utf-8")
                except UnicodeDecodeError:
                    raise _Closed(1007) from None


def _unmask(data: bytes, mask: bytes) -> bytes:
    # XOR as one big integer: a Python loop per byte would cost ~50 ms a MiB.
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


def _drain(sock: socket.socket, timeout: float = 2.0) -> None:
    """Read what the peer still sends (its close frame) until it closes:
    over a Unix socket, closing first makes the peer's close frame fail
    with EPIPE, and the client may then lose the messages before it."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout)
        while sock.recv(4096):
            pass
    except OSError:
        pass


def _error(message: str, code: str, **extra: Any) -> dict:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _reply(env, action_cls, message: Any) -> dict | None:
    """openenv's answer to one message; None for ``close``."""
    kind = message.get("type", "") if isinstance(message, dict) else ""
    data = message.get("data", {}) if isinstance(message, dict) else None
    if kind == "close":
        return None
    try:
        if kind in ("reset", "step") and not isinstance(data, dict):
            raise ActionInvalid([{"type": "dict_type", "loc": ["data"],
                                  "msg": "Input should be a valid dictionary"}])
        if kind == "reset":
            return {"type": "observation", "data": env.reset(**data).serialize()}
        if kind == "step":
            return {"type": "observation", "data": env.step(action_cls(**data)).serialize()}
        if kind == "state":
            if set(message) - {"type"}:
                raise ActionInvalid([{"type": "extra_forbidden", "loc": sorted(set(message) - {"type"}),
                                      "msg": "Extra inputs are not permitted"}])
            return {"type": "state", "data": env.state.model_dump()}
        return _error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
    except ActionInvalid as exc:
        return _error("Invalid message", "VALIDATION_ERROR", errors=exc.errors())
    except Exception as exc:  # noqa: BLE001 -- openenv's EXECUTION_ERROR: the message carries the tag
        return _error(str(exc), "EXECUTION_ERROR")


class Server:
    """``Server(factory, action_cls, path).serve_forever()``; ``close()`` stops accepting.

    ``peer_uid``: the only uid served (root: the camg helper, which hands
    the connection to the General service)."""

    def __init__(self, factory: Callable[[], Any], action_cls: type,
                 path: str = listening.SOCKET_PATH, *, max_size: int = 1 << 24,
                 peer_uid: int = 0) -> None:
        self.factory, self.action_cls, self.max_size = factory, action_cls, max_size
        self.peer_uid = peer_uid
        self.listener = listening.listen(path)
        self.path = path
        self.refused = 0  # connections of another uid, closed unread
        self._session = threading.Lock()

    def serve_forever(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # closed
                return
            if listening.peer_uid(sock) != self.peer_uid:
                self.refused += 1
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), name="mimo-ws", daemon=True).start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    def _serve(self, sock: socket.socket) -> None:
        conn = _Connection(sock, self.max_size)
        try:
            sock.settimeout(30)
            method, path, headers = conn.read_head()
            if method == "GET" and path == "/health":
                body = b'{"status":"healthy"}'
                conn.send_raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
                return
            key = headers.get("sec-websocket-key", "")
            if method != "GET" or path != "/ws" or headers.get("upgrade", "").lower() != "websocket" \
                    or not key:
                conn.send_raw(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            accept = base64.b64encode(hashlib.sha1(key.encode("latin-1") + _GUID).digest())
            conn.send_raw(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            sock.settimeout(None)
            if not self._session.acquire(blocking=False):
                conn.send_json(_error("the transport serves one session at a time", "CAPACITY_REACHED",
                                      active_sessions=1, max_sessions=1))
                conn.close(1013)
                _drain(sock)
                return
            try:
                self._session_loop(conn)
            finally:
                self._session.release()
        except (_Closed, OSError):
            pass
        finally:
            sock.close()

    def _session_loop(self, conn: _Connection) -> None:
        env = self.factory()
        try:
            while True:
                try:
                    raw = conn.receive()
                except _Closed as closed:
                    if closed.code:
                        conn.close(closed.code)
                    return
                try:
                    message = json.loads(raw)
                except ValueError as exc:
                    conn.send_json(_error(f"Invalid JSON: {exc}", "INVALID_JSON"))
                    continue
                reply = _reply(env, self.action_cls, message)
                if reply is None:
                    conn.close(1000)
                    return
                conn.send_json(reply)
        finally:
            env.close()
