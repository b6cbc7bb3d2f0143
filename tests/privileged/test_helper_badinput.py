"""Bad input on the helper socket: typed errors, and the helper keeps serving."""

from __future__ import annotations

import json
import os
import random
import socket
import struct

import pytest

from camg import errors
from camg import helper_wire as wire


def _raw(helper) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(helper.socket)
    return s


def _ask(helper, payload: bytes) -> dict | None:
    """Send raw bytes; the reply frame, or None if the helper just closed."""
    with _raw(helper) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the helper answered and hung up first (e.g. a refused peer)
        try:
            reply, _ = wire.read_frame(s, 1 << 20)
        except EOFError:
            return None
        return reply


def _request(verb: str, params, **envelope) -> bytes:
    return wire.encode({"verb": wire.PREFIX + verb, "params": params, **envelope})


@pytest.mark.parametrize("payload, name", [
    (struct.pack(">II", wire.MAX_JSON + 1, 0), "payload_too_large"),
    (struct.pack(">II", 10, 1 << 29), "payload_too_large"),
    (struct.pack(">II", 5, 0) + b"nope!", "bad_request"),
    (struct.pack(">II", 2, 0) + b"[]", "bad_request"),
    (struct.pack(">II", 4, 0) + b"\xff\xfe{}", "bad_request"),
    (wire.encode({"verb": "io.camg.helper.Nope", "params": {}}), "unknown_verb"),
    (wire.encode({"verb": 7}), "unknown_verb"),
    (wire.encode({"verb": "io.camg.helper.Ping", "params": {}, "extra": 1}), "bad_request"),
    (wire.encode({"verb": "io.camg.helper.Ping", "params": {"x": 1}}), "bad_request"),
    (wire.encode({"verb": "io.camg.helper.Ping", "params": [], "owner": "a/b"}), "bad_request"),
    (wire.encode({"verb": "io.camg.helper.Ping", "params": {}}, b"blob"), "bad_request"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "timeout": "60"}), "bad_request"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "timeout": True}), "bad_request"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "user": "admin"}), "bad_request"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "timeout": 1e9}), "limit_exceeded"),
    (_request("Exec", {"sandbox_id": "x", "command": "a\0b"}), "bad_request"),
    (_request("Exec", {"sandbox_id": "x", "command": "x" * 200_000}), "limit_exceeded"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "cwd": "/a/../.."}), "path_escape"),
    (_request("Exec", {"sandbox_id": "x", "command": "true", "env": {"A=B": "c"}}), "bad_request"),
    (_request("Exec", {"sandbox_id": "../../etc", "command": "true"}), "not_found"),
    (_request("CreateSandbox", {"lowers": [], "memory_bytes": 1, "cpu_quota": 1, "pids_max": 8}),
     "bad_request"),
    (_request("CreateSandbox", {"lowers": ["/etc"], "memory_bytes": 1 << 60, "cpu_quota": 1,
                                "pids_max": 8}), "path_escape"),
    (_request("GetArchive", {"sandbox_id": "x"}), "bad_request"),
    (_request("DestroySandbox", {"sandbox_id": ["x"]}), "bad_request"),
])
def test_malformed_requests_get_named_errors(helper, payload, name):
    reply = _ask(helper, payload)
    assert reply is not None and reply["ok"] is False, reply
    assert reply["error"] == name, reply
    assert helper.client().ping()["probes_ok"]


@pytest.mark.parametrize("field, value", [
    ("memory_bytes", 1 << 62), ("memory_bytes", 1), ("cpu_quota", 1000.0), ("cpu_quota", 0),
    ("pids_max", 10**7), ("pids_max", 0), ("upper_bytes", 1 << 60),
])
def test_absurd_limits_are_refused(client, rootfs, field, value):
    params = {"memory_bytes": 64 << 20, "cpu_quota": 1.0, "pids_max": 32, field: value}
    with pytest.raises(errors.BadRequest) as info:
        client.create_sandbox([str(rootfs)], **params)
    assert info.value.details["helper_error"] == "limit_exceeded"


def test_random_bytes_never_hurt_the_helper(helper):
    rng = random.Random(1234)
    for i in range(300):
        kind = i % 4
        if kind == 0:
            payload = rng.randbytes(rng.randrange(0, 64))
        elif kind == 1:
            body = rng.randbytes(rng.randrange(0, 40))
            payload = struct.pack(">II", len(body), 0) + body
        elif kind == 2:
            obj = {"verb": wire.PREFIX + rng.choice(["Exec", "CreateSandbox", "PutArchive", "Ping"]),
                   "params": {rng.choice(["sandbox_id", "lowers", "command", "zzz"]):
                              rng.choice([None, 1, -1, 2.5, "x", [], {}, [1, "a"], "\u0000"])}}
            payload = wire.encode(obj, rng.randbytes(rng.randrange(0, 3)))
        else:
            full = wire.encode({"verb": wire.PREFIX + "Ping", "params": {}})
            payload = full[: rng.randrange(0, len(full))]  # torn frame
        reply = _ask(helper, payload)
        assert reply is None or (reply["ok"] is False and reply["error"] in wire.ERRORS) \
            or reply.get("result", {}).get("probes_ok") is not None, reply
    assert helper.client().ping()["probes_ok"]


def test_many_requests_on_one_connection_and_pipelining(helper):
    with _raw(helper) as s:
        s.sendall(b"".join(_request("Ping", {}) for _ in range(50)))
        for _ in range(50):
            reply, _ = wire.read_frame(s, 1 << 20)
            assert reply["ok"] is True


def _in_child_as(uid: int, groups: list[int], fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups(groups)
            os.setgid(uid)
            os.setuid(uid)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_foreign_uid_cannot_reach_the_socket_file(helper):
    def connect() -> int:
        try:
            _raw(helper)
        except PermissionError:
            return 0
        return 2
    assert _in_child_as(4242, [], connect) == 0


def test_foreign_uid_is_refused_by_peer_credentials(helper):
    # Even when the socket file is reachable, SO_PEERCRED decides: the helper
    # serves root and group "nogroup" here, and uid 4242 is neither.
    os.chmod(helper.socket, 0o666)
    try:
        code = _in_child_as(4242, [], lambda: 0 if (_ask(helper, _request("Ping", {})) or {}).get(
            "error") == "permission_denied" else 2)
    finally:
        os.chmod(helper.socket, 0o660)
    assert code == 0
    assert helper.client().ping()["probes_ok"]


def test_group_member_is_served_but_sees_only_its_own(helper, client, sandbox):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = {}
        try:
            os.setgroups([65534])
            os.setgid(4242)
            os.setuid(4242)
            from camg.helper_client import HelperClient
            other = HelperClient(helper.socket, owner=client.owner)
            out["list"] = other.list_sandboxes()
            try:
                other.exec(sandbox, "true")
            except errors.NotFound:
                out["exec"] = "not_found"
            out["ping"] = other.ping()["uid"]
        except BaseException as exc:
            out["error"] = repr(exc)
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    data = os.read(r, 65536)
    os.close(r)
    os.waitpid(pid, 0)
    assert json.loads(data) == {"list": [], "exec": "not_found", "ping": 4242}
