"""Helper wire, configuration, path rules and verb parameters (no root needed)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import socket
import struct

import pytest

from camg import errors
from camg import helper_wire as wire
from camg.helper_client import error_from_reply
from camg.sandboxes.containers import ContainerClient, ContainerSpec
from camg.helper_client import HelperClient
from helper import config as configmod
from helper import paths, verbs


def test_frame_round_trip():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(wire.encode({"verb": "x", "params": {"k": [1, "é"]}}, b"\x00blob"))
        obj, blob = wire.read_frame(b, 100)
        assert obj == {"verb": "x", "params": {"k": [1, "é"]}} and blob == b"\x00blob"


@pytest.mark.parametrize("payload, name", [
    (struct.pack(">II", wire.MAX_JSON + 1, 0), "payload_too_large"),
    (struct.pack(">II", 2, 101) + b"{}", "payload_too_large"),
    (struct.pack(">II", 3, 0) + b"{x}", "bad_request"),
    (struct.pack(">II", 4, 0) + b"[1] ", "bad_request"),
])
def test_bad_frames(payload, name):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(payload)
        with pytest.raises(wire.FrameError) as info:
            wire.read_frame(b, 100)
        assert info.value.name == name


@pytest.mark.parametrize("depth", [wire.MAX_FRAME_DEPTH + 1, 990, 100_000])
def test_a_frame_nested_too_deep_is_refused_before_json_recurses(depth):
    body = b'{"verb":"x","params":' + b"[" * depth + b"]" * depth + b"}"
    for read in (wire.read_frame, lambda sock, n: wire.read_frame_with_fd(sock, n)[:2]):
        a, b = socket.socketpair()
        with a, b:
            a.sendall(struct.pack(">II", len(body), 0) + body)
            with pytest.raises(wire.FrameError, match="deeper than") as info:
                read(b, 100)
            assert info.value.name == "bad_request"
    # as deep as allowed still reads
    ok = b"[" * (wire.MAX_FRAME_DEPTH - 2) + b"]" * (wire.MAX_FRAME_DEPTH - 2)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(wire.encode({"verb": "x", "params": json.loads(b'{"k":' + ok + b"}")}))
        assert wire.read_frame(b, 100)[0]["verb"] == "x"


def test_torn_frame_is_eof():
    a, b = socket.socketpair()
    with b:
        a.sendall(wire.encode({"verb": "x"})[:5])
        a.close()
        with pytest.raises(EOFError):
            wire.read_frame(b, 100)


def test_error_names_map_to_the_taxonomy():
    assert isinstance(error_from_reply({"error": "sandbox_died", "message": "m"}), errors.SandboxDied)
    assert isinstance(error_from_reply({"error": "at_capacity", "message": "m"}), errors.AtCapacity)
    assert isinstance(error_from_reply({"error": "path_escape", "message": "m"}), errors.BadRequest)
    odd = error_from_reply({"error": "camg.errors.Whatever", "message": "m"})
    assert type(odd) is errors.InfraFailure
    with pytest.raises(ValueError):
        wire.WireError("not_a_name", "x")


def test_client_against_a_fake_socket(tmp_path):
    """The client's framing, owner and error mapping, against a scripted peer."""
    path = str(tmp_path / "s")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    import threading

    seen = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            req, blob = wire.read_frame(conn, 1 << 20)
            seen.append((req, blob))
            conn.sendall(wire.encode({"ok": True, "result": {"exit_code": 0, "output": "o",
                                      "truncated": False, "timed_out": False, "duration": 0.1}}))
            req, blob = wire.read_frame(conn, 1 << 20)
            conn.sendall(wire.encode({"ok": False, "error": "sandbox_died", "message": "gone"}))

    t = threading.Thread(target=serve)
    t.start()
    c = HelperClient(path, owner="coding")
    r = c.exec("abc", "echo", stdin=b"in", env={"A": "1"})
    assert r.output == "o" and r.exit_code == 0
    with pytest.raises(errors.SandboxDied):
        c.exec("abc", "echo")
    t.join()
    c.close()
    req, blob = seen[0]
    assert req["verb"] == "io.camg.helper.Exec" and req["owner"] == "coding" and blob == b"in"
    assert req["params"]["env"] == {"A": "1"} and req["params"]["output_limit"] == 12000


def test_client_unreachable_is_unavailable(tmp_path):
    with pytest.raises(errors.Unavailable):
        HelperClient(str(tmp_path / "missing.sock")).ping()


def test_config_defaults_and_strictness(tmp_path):
    cfg = configmod.HelperConfig()
    assert cfg.socket == "/run/camg/helper.sock" and cfg.group == "camg"
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"ceilings": {"timeout": 60}, "cgroup_parents": {"memory": "/x"}}))
    loaded = configmod.load(str(p))
    assert loaded.ceilings.timeout == 60.0 and loaded.cgroup_parents["memory"] == "/x"
    for bad in ({"nope": 1}, {"ceilings": {"timeout": "60"}}, {"cgroup_parents": {"blkio": "/x"}},
                {"lower_roots": ["rel"]}, {"agent_uid": 0}, {"ceilings": {"pids_max": 0}}):
        p.write_text(json.dumps(bad))
        with pytest.raises(configmod.ConfigError):
            configmod.load(str(p))


def test_cgroup_parents_default_and_delegated(tmp_path, monkeypatch):
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    parents = configmod.resolve_cgroup_parents(configmod.HelperConfig())
    assert parents["pids"] == "/sys/fs/cgroup/pids/camg"
    proc = tmp_path / "cgroup"
    proc.write_text("6:freezer:/system.slice/camg-helper.service\n4:memory:/system.slice/camg-helper.service\n"
                    "2:cpu,cpuacct:/system.slice/camg-helper.service\n8:pids:/\n")
    monkeypatch.setenv("INVOCATION_ID", "x")
    parents = configmod.resolve_cgroup_parents(configmod.HelperConfig(), str(proc))
    assert parents["cpu"] == "/sys/fs/cgroup/cpu/system.slice/camg-helper.service"
    assert parents["pids"] == "/sys/fs/cgroup/pids/camg"


def test_lower_resolution(tmp_path):
    root = tmp_path / "roots"
    (root / "img" / "usr").mkdir(parents=True)
    (root / "file").write_text("")
    (root / "link").symlink_to(root / "img")
    roots = (str(root),)
    assert paths.resolve_lower(str(root / "img") + "/", roots) == str(root / "img")
    cases = {
        str(root): "path_escape", "/etc": "path_escape", "img": "path_escape",
        str(root / "img" / ".." / "img"): "path_escape", str(root / "link"): "path_escape",
        str(root / "link" / "usr"): "path_escape", str(root / "file"): "bad_request",
        str(root / "missing"): "not_found", str(root / "a,b"): "bad_request",
        str(root / "a:b"): "bad_request", 5: "bad_request", "": "bad_request",
    }
    for value, name in cases.items():
        with pytest.raises(wire.WireError) as info:
            paths.resolve_lower(value, roots)
        assert info.value.name == name, value
    assert paths.sandbox_path("/a//b/", "p") == "/a/b"


def test_verb_parameters_are_strict():
    ctx = verbs.Context(registry=None, run_probes=lambda: {})
    from helper.sandbox_table import Peer
    peer = Peer(0, 0, 1, "t")
    for verb, params, name in [
        ("io.camg.helper.Exec", {"sandbox_id": "a"}, "bad_request"),
        ("io.camg.helper.Exec", {"sandbox_id": "a", "command": "x", "bogus": 1}, "bad_request"),
        ("io.camg.helper.CreateSandbox", {"lowers": "x", "memory_bytes": 1, "cpu_quota": 1,
                                          "pids_max": 1}, "bad_request"),
        ("io.camg.helper.Ping", [], "bad_request"),
        ("io.camg.helper.Shell", {}, "unknown_verb"),
        ("Ping", {}, "unknown_verb"),
    ]:
        with pytest.raises(wire.WireError) as info:
            verbs.dispatch(ctx, peer, verb, params, b"")
        assert info.value.name == name, (verb, params)


def test_every_verb_takes_the_wires_params_type():
    """One closed table: the helper's rows are the wire's verbs, each parsing
    into the very dataclass camg.helper_wire names (not a copy)."""
    assert list(verbs.VERBS) == list(wire.PARAMS) == list(wire.VERBS)
    for name, verb in verbs.VERBS.items():
        assert verb.params is wire.PARAMS[name], name
        assert verb.params.__module__ == "camg.helper_wire", name
        assert dataclasses.is_dataclass(verb.params) and verb.params.__dataclass_params__.frozen, name
        # Strict: an unknown field is a bad_request naming it, for every verb.
        with pytest.raises(wire.WireError) as info:
            wire.parse(verb.params, {"no_such_field": 1}, "params", verbs.BadParams)
        assert info.value.name == "bad_request" and "no_such_field" in info.value.message, name


def _defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _wire_defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize("method, cls", [
    (HelperClient.create_sandbox, wire.CreateSandboxParams),
    (HelperClient.exec, wire.ExecParams),
    (HelperClient.put_archive, wire.PutArchiveParams),
    (ContainerClient.exec, wire.ContainerExecParams),
    (ContainerClient.logs, wire.ContainerLogsParams),
    (ContainerSpec, wire.ContainerCreateParams),
])
def test_client_defaults_are_the_wires(method, cls):
    """Every default a client method (or ContainerSpec) states is the wire
    type's own, and every field it shares with the type has that default."""
    mine, theirs = _defaults(method), _wire_defaults(cls)
    shared = set(mine) & set(theirs)
    assert shared, (method, cls)
    assert {k: mine[k] for k in shared} == {k: theirs[k] for k in shared}
    assert set(theirs) - set(mine) <= {"episode_id", "pool", "network", "privileged", "cap_add",
                                       "devices", "binds"}, "a wire default the client cannot pass"


def test_client_builds_requests_from_the_wire_types():
    assert wire.request("Exec", wire.ExecParams("s", "c"), "o")["params"] == {
        "user": "agent", "cwd": "/", "env": {}, "timeout": 60.0, "output_limit": 12000,
        "sandbox_id": "s", "command": "c"}
    with pytest.raises(TypeError):
        wire.request("ContainerExec", wire.ExecParams("s", "c"), "o")
    with pytest.raises(TypeError):
        wire.request("Shell", wire.NoParams(), "o")
    # What a client builds, the helper parses back to an equal value.
    spec = ContainerSpec(image="r@sha256:" + "a" * 64, cpu=1.0, memory_bytes=1 << 28, pids_max=64,
                         command=("sleep", "1"), env={"A": "1"})
    built = spec.create_params(episode_id="e", pool=True)
    sent = json.loads(json.dumps(wire.request("ContainerCreate", built, "o")))
    assert wire.parse(wire.ContainerCreateParams, sent["params"], "params", verbs.BadParams) == built


def test_describe_lists_every_verb():
    described = {v["verb"] for v in verbs.describe()}
    assert described == set(wire.VERBS)
    json.dumps(verbs.describe(), default=str)


def test_sbxinit_source_builds(tmp_path):
    from helper import initbin
    if not any(os.access(os.path.join(d, "cc"), os.X_OK) for d in os.environ["PATH"].split(":")):
        pytest.fail("a C compiler (build-essential) is required to build the sandbox init")
    binary = initbin.ensure("", str(tmp_path))
    assert os.access(binary, os.X_OK)
    assert initbin.ensure("", str(tmp_path)) == binary  # cached by source hash
