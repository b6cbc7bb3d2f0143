"""The wire between camg-helper and its clients.

One frame per request and per reply on a SOCK_STREAM Unix socket:

    u32 json_length | u32 blob_length | JSON object | blob

(big-endian). A request is ``{"verb": NAME, "params": {...}, "owner": LABEL}``
plus an optional blob (stdin for Exec, a tar stream for PutArchive); a reply
is ``{"ok": true, "result": {...}}`` plus an optional blob (a tar stream for
GetArchive), or ``{"ok": false, "error": NAME, "message": TEXT}``.

Error names are a closed set (``ERRORS``); the client (camg.helper_client)
maps each onto the camg.errors class it resembles, so no class path ever
crosses the socket. Both sides import this module; it holds no helper
internals and imports nothing of camg but the strict parser (camg.typed,
itself a leaf): what the root helper runs of camg/ is these two files.
"""

from __future__ import annotations

import json
import os
import socket
import struct

from camg.typed import parse  # noqa: F401  (the helper's strict parser)


PREFIX = "io.camg.helper."
VERBS = tuple(PREFIX + v for v in (
    "Ping", "Probe", "CreateSandbox", "Exec", "PutArchive", "GetArchive",
    "DestroySandbox", "ReleaseAll", "ListSandboxes",
    # The container mediator (helper/containers.py): Docker through the helper.
    "ContainerPull", "ContainerCreate", "ContainerConnect", "ContainerExec",
    "ContainerPutArchive", "ContainerGetArchive", "ContainerLogs", "ContainerRemove",
    "ContainerList", "ContainerReleaseAll",
))

#: The helper's default ceiling of live sandboxes per peer (one service's
#: owner label); environments derive their default capacity from it
#: (camg.plugins.default_capacity).
SANDBOXES_PER_PEER = 512

HEADER = struct.Struct(">II")
# The JSON part carries commands and small parameters only; bulk bytes go
# in the blob, whose ceiling the helper's configuration sets.
MAX_JSON = 1 << 20
MAX_BLOB_HARD = 1 << 30

TRUNCATION_MARKER = "[output truncated to final {limit} bytes]\n"
TIMEOUT_MARKER = "\n[command timed out]"

# The closed set of error names a reply may carry.
ERRORS = frozenset({
    "bad_request", "unknown_verb", "path_escape", "limit_exceeded", "payload_too_large",
    "permission_denied", "not_found", "at_capacity", "probes_failed", "sandbox_died",
    "internal",
    # The container mediator: a policy refusal, Docker not reachable or not
    # configured, nothing listening on the port ContainerConnect asked for.
    "not_allowed", "docker_unavailable", "connection_refused",
})

class WireError(Exception):
    """An error the helper reports by name; raised inside the helper only."""

    def __init__(self, name: str, message: str) -> None:
        if name not in ERRORS:
            raise ValueError(f"not a helper error name: {name}")
        super().__init__(message)
        self.name = name
        self.message = message


class FrameError(Exception):
    """The byte stream is not a valid frame; the connection cannot continue."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


def encode(obj: dict, blob: bytes = b"") -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(body), len(blob)) + body + blob


class FdBlob(bytes):
    """A reply blob that also hands the peer one file descriptor (SCM_RIGHTS).

    ContainerConnect replies with a socket connected inside a container's
    network namespace; the helper closes its copy once the frame is sent.
    """

    fd: int = -1

    @classmethod
    def carrying(cls, fd: int, data: bytes = b"") -> "FdBlob":
        blob = cls(data)
        blob.fd = fd
        return blob


def send_frame(sock: socket.socket, obj: dict, blob: bytes = b"") -> None:
    """Send one frame; an FdBlob's descriptor rides on its first bytes."""
    data = encode(obj, blob)
    fd = getattr(blob, "fd", -1)
    if fd < 0:
        sock.sendall(data)
        return
    try:
        sent = socket.send_fds(sock, [data], [fd])
        if sent < len(data):
            sock.sendall(data[sent:])
    finally:
        os.close(fd)


def read_frame_with_fd(sock: socket.socket, max_blob: int) -> tuple[dict, bytes, int]:
    """Like read_frame, but also returns the descriptor sent with it (-1: none).

    The descriptor arrives with the frame's first bytes, so those are read
    with recvmsg; plain recv would drop (and close) it.
    """
    data, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, 1)
    if not data:
        raise EOFError("peer closed")
    fd = fds[0] if fds else -1
    try:
        head = data + (_recv_exact(sock, HEADER.size - len(data)) if len(data) < HEADER.size else b"")
        jlen, blen = HEADER.unpack(head)
        if jlen > MAX_JSON or blen > max_blob:
            raise FrameError("payload_too_large", "reply frame too large")
        body = _recv_exact(sock, jlen)
        blob = _recv_exact(sock, blen) if blen else b""
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise FrameError("bad_request", "frame must be a JSON object")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return obj, blob, fd


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("peer closed the connection mid-frame" if got else "peer closed")
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket, max_blob: int) -> tuple[dict, bytes]:
    """One frame from ``sock``; raises EOFError at a clean end of stream."""
    head = _recv_exact(sock, HEADER.size)
    jlen, blen = HEADER.unpack(head)
    if jlen > MAX_JSON:
        raise FrameError("payload_too_large", f"JSON part of {jlen} bytes exceeds {MAX_JSON}")
    if blen > max_blob:
        raise FrameError("payload_too_large", f"blob of {blen} bytes exceeds {max_blob}")
    body = _recv_exact(sock, jlen)
    blob = _recv_exact(sock, blen) if blen else b""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError("bad_request", f"frame is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("bad_request", "frame must be a JSON object")
    return obj, blob
