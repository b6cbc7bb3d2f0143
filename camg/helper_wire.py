"""The wire between camg-helper and its clients.

One frame per request and per reply on a SOCK_STREAM Unix socket:

    u32 json_length | u32 blob_length | JSON object | blob

(big-endian). A request is ``{"verb": NAME, "params": {...}, "owner": LABEL}``
plus an optional blob (stdin for Exec, a tar stream for PutArchive); a reply
is ``{"ok": true, "result": {...}}`` plus an optional blob (a tar stream for
GetArchive), or ``{"ok": false, "error": NAME, "message": TEXT}``.

Each verb's ``params`` is one frozen dataclass below (``PARAMS``), defaults
included: the helper parses requests into it strictly, the clients
(camg.helper_client, camg.sandboxes.containers) build requests from it (``request``),
so a default or a field exists once. Error names are a closed set
(``ERRORS``); the client maps each onto the camg.errors class it resembles,
so no class path ever crosses the socket. Both sides import this module; it
holds no helper internals and imports nothing of camg but the strict parser
(camg.typed, itself a leaf): what the root helper runs of camg/ is these two
files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from camg import json_depth
from camg.typed import parse, to_json  # noqa: F401  (parse: the helper's strict parser)

PREFIX = "io.camg.helper."

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
ERRORS = frozenset(
    {
        "bad_request",
        "unknown_verb",
        "path_escape",
        "limit_exceeded",
        "payload_too_large",
        "permission_denied",
        "not_found",
        "at_capacity",
        "probes_failed",
        "sandbox_died",
        "internal",
        # The container mediator: a policy refusal, Docker not reachable or not
        # configured, nothing listening on the port ContainerConnect asked for.
        "not_allowed",
        "docker_unavailable",
        "connection_refused",
    }
)

# -- typed parameters, one frozen dataclass per verb -----------------------------

_EMPTY: Mapping[str, str] = MappingProxyType({})


def _empty() -> Mapping[str, str]:
    return _EMPTY


@dataclasses.dataclass(frozen=True)
class NoParams:
    pass


@dataclasses.dataclass(frozen=True)
class CreateSandboxParams:
    lowers: tuple[str, ...]  # bottom-first
    memory_bytes: int
    cpu_quota: float  # cores
    pids_max: int
    hostname: str = "sandbox"
    upper: Literal["tmpfs", "disk"] = "tmpfs"
    upper_bytes: int = 0  # tmpfs size; 0 means the helper's configured default


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecOptions:
    """How a command runs, in a sandbox (Exec) or a container (ContainerExec)."""

    user: Literal["agent", "root"] = "agent"
    cwd: str = "/"
    env: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    timeout: float = 60.0
    output_limit: int = 12000  # the final bytes of output kept


@dataclasses.dataclass(frozen=True)
class ExecParams(ExecOptions):
    sandbox_id: str
    command: str


@dataclasses.dataclass(frozen=True)
class PutArchiveParams:
    sandbox_id: str
    dest_dir: str
    user: Literal["agent", "root"] = "root"


@dataclasses.dataclass(frozen=True)
class GetArchiveParams:
    sandbox_id: str
    path: str


@dataclasses.dataclass(frozen=True)
class SandboxParams:
    sandbox_id: str


@dataclasses.dataclass(frozen=True)
class ForkSandboxParams:
    """A new sandbox of the caller's over one of its own as it stands: the
    parent's upper becomes a read-only layer under a fresh upper on each
    side (helper/forks.py). The filesystem is carried, processes are not: a
    parent still running anything besides its init is refused (not_allowed,
    message "processes: ..."). A parent untouched since its last fork adds
    no layer (reply ``reused``); past ceilings.fork_depth stacked layers
    they are squashed into one, and a squash past the parent's upper size
    is limit_exceeded ("fork_depth: ...")."""

    sandbox_id: str


@dataclasses.dataclass(frozen=True)
class ContainerPullParams:
    image: str


@dataclasses.dataclass(frozen=True)
class ContainerCreateParams:
    image: str  # REPO@sha256:HEX, listed in the helper's allowed-images manifest
    cpu: float
    memory_bytes: int
    pids_max: int
    episode_id: str = ""
    command: tuple[str, ...] = ()  # exec form; empty: the image's CMD
    env: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    workdir: str = ""
    user: Literal["", "agent", "root"] = ""  # "": the image's USER
    mount_agent_env: bool = False
    pool: bool = False  # a warm-pool container: no episode yet
    labels: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    # These exist only so that asking for them gets a named refusal.
    network: str = "none"
    privileged: bool = False
    cap_add: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ContainerParams:
    container_id: str


@dataclasses.dataclass(frozen=True)
class ContainerForkParams:
    """A new container of the caller's, from a snapshot of one of its own
    (its filesystem as it stands, the parent paused meanwhile), created with
    the parent's parameters (helper/container_fork.py)."""

    container_id: str
    episode_id: str = ""
    # Processes are not carried by a snapshot: an agent process still
    # running in the parent is refused by name unless the caller allows it.
    allow_agent_processes: bool = False


@dataclasses.dataclass(frozen=True)
class ContainerConnectParams:
    container_id: str
    port: int
    timeout: float = 5.0


@dataclasses.dataclass(frozen=True)
class ContainerExecParams(ExecOptions):
    container_id: str
    command: str


@dataclasses.dataclass(frozen=True)
class ContainerPutArchiveParams:
    container_id: str
    dest_dir: str


@dataclasses.dataclass(frozen=True)
class ContainerGetArchiveParams:
    container_id: str
    path: str


@dataclasses.dataclass(frozen=True)
class ContainerLogsParams:
    container_id: str
    tail_bytes: int = 65536


# The closed set of verbs and each one's parameters (helper/verbs.py holds
# the handlers; a test checks the two tables name the same verbs and types).
PARAMS: Mapping[str, type] = MappingProxyType(
    {
        PREFIX + name: cls
        for name, cls in (
            ("Ping", NoParams),
            ("Probe", NoParams),
            ("CreateSandbox", CreateSandboxParams),
            ("Exec", ExecParams),
            ("PutArchive", PutArchiveParams),
            ("GetArchive", GetArchiveParams),
            ("DestroySandbox", SandboxParams),
            ("ReleaseAll", NoParams),
            ("ListSandboxes", NoParams),
            ("SandboxUsage", SandboxParams),
            ("ForkSandbox", ForkSandboxParams),
            ("KillCommands", SandboxParams),
            # The container mediator (helper/containers.py): Docker through the helper.
            ("ContainerPull", ContainerPullParams),
            ("ContainerCreate", ContainerCreateParams),
            ("ContainerConnect", ContainerConnectParams),
            ("ContainerExec", ContainerExecParams),
            ("ContainerPutArchive", ContainerPutArchiveParams),
            ("ContainerGetArchive", ContainerGetArchiveParams),
            ("ContainerLogs", ContainerLogsParams),
            ("ContainerRemove", ContainerParams),
            ("ContainerList", NoParams),
            ("ContainerReleaseAll", NoParams),
            ("ContainerUsage", ContainerParams),
            ("ContainerFork", ContainerForkParams),
            ("ContainerReap", ContainerParams),
        )
    }
)
VERBS = tuple(PARAMS)


def request(verb: str, params: object, owner: str) -> dict:
    """A request's JSON part, its params built from the verb's own type."""
    name = verb if verb.startswith(PREFIX) else PREFIX + verb
    cls = PARAMS.get(name)
    if cls is None or type(params) is not cls:
        raise TypeError(
            f"{name} takes {getattr(cls, '__name__', 'no parameters (unknown verb)')}, "
            f"not {type(params).__name__}"
        )
    return {"verb": name, "params": to_json(params), "owner": owner}


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
    def carrying(cls, fd: int, data: bytes = b"") -> FdBlob:
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
        head = data + (
            _recv_exact(sock, HEADER.size - len(data)) if len(data) < HEADER.size else b""
        )
        jlen, blen = HEADER.unpack(head)
        if jlen > MAX_JSON or blen > max_blob:
            raise FrameError("payload_too_large", "reply frame too large")
        body = _recv_exact(sock, jlen)
        blob = _recv_exact(sock, blen) if blen else b""
        obj = _loads(body)
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
    return _loads(body), blob


#: the deepest a frame's JSON may nest; verbs' parameters are a few levels
MAX_FRAME_DEPTH = 32


def _loads(body: bytes) -> dict:
    """A frame's JSON object; deeper than MAX_FRAME_DEPTH is refused before
    json (or the verb's parser after it) can recurse that far."""
    if json_depth.too_deep(body, MAX_FRAME_DEPTH):
        raise FrameError("bad_request", f"frame nests deeper than {MAX_FRAME_DEPTH} levels")
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError("bad_request", f"frame is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("bad_request", "frame must be a JSON object")
    return obj
