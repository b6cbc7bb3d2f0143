"""A real root helper under 1,000 slow connections to its metrics port
(helper.json ``metrics_port``, loopback: any local user can connect).

Its metrics listener (camg.metrics.ScrapeServer) is one event loop: the
flood must not add a thread to the helper, scrapes and Ping must be
answered during it and after, sandboxes made and destroyed, and every slow
connection dropped within the read timeout. The latency of creates with and
without the flood is bench/bench_helper_flood.py's to report, not this
test's to judge."""

from __future__ import annotations

import os
import shutil
import socket
import time
import urllib.request

import pytest

import conftest as pc
from camg.metrics import ScrapeServer
from devtools.harness import helpers
from devtools.harness.services import free_port

FLOOD = 1000
LIMITS = {"memory_bytes": 128 << 20, "cpu_quota": 0.5, "pids_max": 64}


@pytest.fixture
def metered_helper(lower_root, rootfs):
    base = helpers.private_base("helper-flood")
    port = free_port()
    helper = pc.start_helper(base, pc.helper_config(base, lower_root, rootfs, metrics_port=port))
    yield helper, port
    pc.stop_helper(helper)
    pc.WATCH.forget_state_under(base)
    shutil.rmtree(base)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read()


def _serves(helper, port: int, rootfs) -> None:
    """What the helper is for, answered now."""
    assert b"camg_helper_probes_ok 1.0" in _scrape(port)
    client = helper.client()
    try:
        assert client.ping()["probes_ok"]
        client.destroy(client.create_sandbox([str(rootfs)], **LIMITS))
    finally:
        client.close()


def test_a_flood_of_slow_metrics_connections_leaves_the_helper_serving(metered_helper,
                                                                       rootfs):
    helper, port = metered_helper
    _serves(helper, port, rootfs)
    idle = _threads(helper.proc.pid)
    flood = []
    try:
        for i in range(FLOOD):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            # half send part of a head, half nothing at all
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: a" if i % 2 else b"")
            flood.append(sock)
            if i % 200 == 199:
                _serves(helper, port, rootfs)
                # no thread per connection (prometheus-client's server: +136 at 300)
                assert _threads(helper.proc.pid) <= idle + 2
        # every one of them is dropped (evicted as the oldest of the readers,
        # or at the read timeout), none answered
        deadline = time.monotonic() + ScrapeServer.READ_TIMEOUT_S + 30
        for sock in flood:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                assert sock.recv(4096) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in flood:
            sock.close()
    _serves(helper, port, rootfs)
    assert _threads(helper.proc.pid) <= idle + 2
    assert helper.alive()
    assert "Traceback" not in helper.log()
