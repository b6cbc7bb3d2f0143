"""Every helper ceiling, at its boundary, refused before any work starts.

One private helper with small ceilings; each test asks for exactly the
ceiling (served) and one past it (a named error). The autouse leak check
proves a refused request created nothing (no cgroup, ledger entry, upper).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path

import pytest

from camg import errors
from camg import helper_wire as wire

import conftest as pc

CEILINGS = {"output_bytes": 12000, "archive_bytes": 8192, "lowers": 2, "sandboxes_per_peer": 1,
            "sandboxes_total": 8, "connections": 4, "command_bytes": 64, "env_entries": 2,
            "timeout": 60.0}
SPEC = dict(memory_bytes=256 << 20, cpu_quota=1.0, pids_max=64)


@pytest.fixture(scope="module")
def small(lower_root, rootfs):
    base = Path(tempfile.mkdtemp(prefix="camg-helper-test-"))
    cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False, ceilings=CEILINGS)
    helper = pc.start_helper(base, cfg)
    pc.state_root(base / "state" / "ledger")
    pc.state_root(base / "uppers")
    yield helper
    pc.stop_helper(helper)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def box(small, rootfs):
    client = small.client(owner="ceil")
    sid = client.create_sandbox([str(rootfs)], **SPEC)
    yield client, sid
    client.destroy(sid)
    client.close()


def _limit(exc_info) -> str:
    return exc_info.value.details["helper_error"]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_output_limit_zero_and_past_ceiling_are_refused(box):
    client, sid = box
    for bad in (0, -1, CEILINGS["output_bytes"] + 1):
        with pytest.raises(errors.BadRequest) as info:
            client.exec(sid, "echo hi", output_limit=bad)
        assert _limit(info) == "limit_exceeded"
    one = client.exec(sid, "printf abc", output_limit=1)
    assert one.truncated and one.output.endswith("\nc")
    full = client.exec(sid, "head -c 12000 /dev/zero | tr '\\0' x", output_limit=12000)
    assert not full.truncated and full.output == "x" * 12000


def test_output_flood_keeps_the_helper_bounded(small, box):
    client, sid = box
    before = _rss_kib(small.proc.pid)
    r = client.exec(sid, "head -c 200000000 /dev/zero | tr '\\0' y; echo END", output_limit=64)
    assert r.truncated and r.output.endswith("yyyEND\n")
    grown = _rss_kib(small.proc.pid) - before
    # The ring holds at most 2*limit + 64 KiB; allow the interpreter's noise.
    assert grown < 32 * 1024, f"helper RSS grew by {grown} KiB for a 200 MB flood"


def test_command_env_and_timeout_ceilings(box):
    client, sid = box
    assert client.exec(sid, "#" * 64).exit_code == 0
    with pytest.raises(errors.BadRequest) as info:
        client.exec(sid, "#" * 65)
    assert _limit(info) == "limit_exceeded"
    assert client.exec(sid, "true", env={"A": "1", "B": "2"}).exit_code == 0
    with pytest.raises(errors.BadRequest) as info:
        client.exec(sid, "true", env={"A": "1", "B": "2", "C": "3"})
    assert _limit(info) == "limit_exceeded"
    assert client.exec(sid, "true", timeout=60.0).exit_code == 0
    for bad in (60.01, 0, -1):
        with pytest.raises(errors.BadRequest) as info:
            client.exec(sid, "true", timeout=bad)
        assert _limit(info) == "limit_exceeded"


def test_lowers_ceiling(small, rootfs, lower_root):
    layers = [lower_root / f"ceilings-layer-{i}" for i in range(2)]
    for layer in layers:
        layer.mkdir(exist_ok=True)
    client = small.client(owner="lowers")
    try:
        sid = client.create_sandbox([str(rootfs), str(layers[0])], **SPEC)
        client.destroy(sid)
        with pytest.raises(errors.BadRequest) as info:
            client.create_sandbox([str(rootfs), *map(str, layers)], **SPEC)
        assert _limit(info) == "limit_exceeded"
    finally:
        client.close()


def test_sandboxes_per_peer_ceiling(small, rootfs):
    client = small.client(owner="perpeer")
    try:
        first = client.create_sandbox([str(rootfs)], **SPEC)
        with pytest.raises(errors.AtCapacity):
            client.create_sandbox([str(rootfs)], **SPEC)
        client.destroy(first)
        client.destroy(client.create_sandbox([str(rootfs)], **SPEC))
    finally:
        client.close()


def _connect(helper) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(helper.socket)
    return s


def test_request_size_is_refused_from_the_header(box, small):
    client, sid = box
    # A blob of exactly archive_bytes is served (as Exec's stdin) ...
    r = client.exec(sid, "wc -c", stdin=b"z" * CEILINGS["archive_bytes"])
    assert r.output.strip() == str(CEILINGS["archive_bytes"])
    # ... one byte more is refused as soon as the header arrives: the body
    # is never sent, so an answer proves nothing was read or buffered.
    for header in (struct.pack(">II", 10, CEILINGS["archive_bytes"] + 1),
                   struct.pack(">II", wire.MAX_JSON + 1, 0)):
        with _connect(small) as s:
            s.sendall(header)
            reply, _ = wire.read_frame(s, 1 << 20)
            assert reply == {"ok": False, "error": "payload_too_large",
                             "message": reply["message"]}
            assert s.recv(1) == b""  # and the connection is over


def test_concurrent_connections_ceiling(small):
    held = [_connect(small) for _ in range(CEILINGS["connections"])]
    try:
        for s in held:  # each is admitted and served
            s.sendall(wire.encode({"verb": wire.PREFIX + "Ping", "params": {}}))
            assert wire.read_frame(s, 1 << 20)[0]["ok"] is True
        with _connect(small) as extra:
            reply, _ = wire.read_frame(extra, 1 << 20)
            assert reply["error"] == "at_capacity"
    finally:
        held.pop().close()
    # The freed slot is served again once its thread has seen the hang-up.
    deadline = time.monotonic() + 5
    while True:
        try:
            with _connect(small) as s:
                s.sendall(wire.encode({"verb": wire.PREFIX + "Ping", "params": {}}))
                reply, _ = wire.read_frame(s, 1 << 20)
        except (EOFError, OSError):
            reply = {"ok": False}  # refused while the slot was still held
        if reply["ok"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for s in held:
        s.close()
    assert reply["ok"] is True


@pytest.mark.parametrize("field", ["lowers", "connections", "output_bytes", "sandboxes_per_peer"])
def test_non_positive_ceilings_are_config_errors(tmp_path, field):
    from helper import config
    path = tmp_path / "helper.json"
    path.write_text('{"ceilings": {"%s": 0}}' % field)
    with pytest.raises(config.ConfigError, match="ceiling"):
        config.load(str(path))
    assert os.path.exists(path)


def test_a_burst_of_connections_queues_instead_of_failing(helper):
    """Hundreds of episodes resetting at once: every connect is served (the
    backlog was 128 and a full one made connect fail with EAGAIN)."""
    import threading
    from camg.helper_client import HelperClient
    barrier = threading.Barrier(400)
    failures: list[str] = []

    def ping() -> None:
        client = HelperClient(helper.socket, owner="burst")
        barrier.wait()
        try:
            client.ping()
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=ping) for _ in range(400)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures[:3]
