"""The helper's own metrics (camg.metrics.HelperMetrics): counted per verb
and error name by the server that answers the helper socket, served on a
loopback port of their own (helper.json metrics_port), never as a verb.
The privileged half (a real helper's sandboxes, probes and sweep, scraped
by a real Prometheus) is tests/privileged/test_prometheus_coding.py."""

from __future__ import annotations

import json
import socket
import types
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from camg import helper_wire as wire
from camg.metrics import HelperMetrics
from helper import server as server_mod, verbs
from helper.config import ConfigError, HelperConfig
from helper.sandbox_table import Peer
from devtools.harness.services import free_port

REPO = Path(__file__).resolve().parents[2]
PING = wire.PREFIX + "Ping"


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exposed(metrics: HelperMetrics) -> dict:
    from prometheus_client import generate_latest
    return samples(generate_latest(metrics.registry).decode())


def serve(metrics: HelperMetrics, frames: list[bytes]) -> list[dict]:
    """Each raw frame through Server._one, as a connection would send it."""
    srv = object.__new__(server_mod.Server)
    registry = types.SimpleNamespace(probe_failure=None, config=HelperConfig(),
                                     warm_uppers=types.SimpleNamespace(status=dict))
    srv.ctx = verbs.Context(registry, lambda: {"ok": True})
    srv.max_blob, srv.metrics = 1 << 20, metrics
    replies = []
    for frame in frames:
        ours, theirs = socket.socketpair()
        try:
            theirs.sendall(frame)
            theirs.shutdown(socket.SHUT_WR)
            srv._one(ours, Peer(0, 0, 1, "default"))
            replies.append(wire.read_frame(theirs, 1 << 20)[0])
        finally:
            ours.close()
            theirs.close()
    return replies


def frame(request: dict) -> bytes:
    a, b = socket.socketpair()
    try:
        wire.send_frame(a, request)
        a.close()
        return b.recv(1 << 16)
    finally:
        b.close()


def test_requests_are_counted_by_verb_and_error_name():
    m = HelperMetrics()
    replies = serve(m, [frame({"verb": PING}), frame({"verb": PING}),
                        frame({"verb": PING, "params": {"nope": 1}}),
                        frame({"verb": "io.camg.helper.Metrics"}),
                        # an HTTP scrape sent to the helper socket is no verb
                        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"])
    assert [r["ok"] for r in replies] == [True, True, False, False, False]
    assert replies[3]["error"] == "unknown_verb"
    got = exposed(m)
    count = lambda verb, error: got.get(("camg_helper_requests_total",  # noqa: E731
                                         (("error", error), ("verb", verb))))
    assert count(PING, "none") == 2
    assert count(PING, "bad_request") == 1
    # Unknown verbs and unreadable frames share one label: no label is free text.
    assert count("unknown", "unknown_verb") == 1
    assert count("unknown", replies[4]["error"]) == 1
    assert got[("camg_helper_request_seconds_count", (("verb", PING),))] == 3
    assert 0 <= got[("camg_helper_request_seconds_sum", (("verb", PING),))] < 1
    assert not any("io.camg.helper.Metrics" in dict(labels).get("verb", "")
                   for _, labels in got)


def test_the_verb_table_has_no_metrics_verb():
    # The metrics endpoint is a listener of its own, not a row of the closed table.
    assert not any("metric" in name.lower() for name in verbs.VERBS)


def test_gauges_read_what_the_helper_holds_and_sweeps_count():
    held = {"sandboxes": 3, "containers": 1, "ok": False}
    m = HelperMetrics()
    m.watch(sandboxes=lambda: held["sandboxes"], containers=lambda: held["containers"],
            probes_ok=lambda: held["ok"])
    m.swept(2, 0)
    got = exposed(m)
    assert got[("camg_helper_sandboxes_live", ())] == 3
    assert got[("camg_helper_containers_live", ())] == 1
    assert got[("camg_helper_probes_ok", ())] == 0
    assert got[("camg_helper_sweeps_total", ())] == 1
    assert got[("camg_helper_swept_total", (("kind", "sandboxes"),))] == 2
    assert got[("camg_helper_swept_total", (("kind", "containers"),))] == 0
    held.update(sandboxes=0, ok=True)
    got = exposed(m)
    assert got[("camg_helper_sandboxes_live", ())] == 0 and got[("camg_helper_probes_ok", ())] == 1


def test_served_on_loopback_only_and_stopped():
    m = HelperMetrics()
    m.watch(sandboxes=lambda: 0, containers=lambda: 0, probes_ok=lambda: True)
    port = free_port()
    stop = m.serve(port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert ("camg_helper_probes_ok", ()) in samples(r.read().decode())
        bound = {line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A"}  # LISTEN
        assert f"0100007F:{port:04X}" in bound  # 127.0.0.1, not 0.0.0.0
        assert f"00000000:{port:04X}" not in bound
    finally:
        stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_metrics_port_is_validated_and_the_installed_config_serves_one():
    assert HelperConfig().metrics_port == 0  # tests' helpers: none unless asked
    for bad in (-1, 65536):
        with pytest.raises(ConfigError, match="metrics_port"):
            HelperConfig(metrics_port=bad)
    installed = wire.parse(HelperConfig, json.loads((REPO / "units" / "helper.json").read_text()),
                           "helper", ConfigError)
    assert installed.metrics_port == 65148
