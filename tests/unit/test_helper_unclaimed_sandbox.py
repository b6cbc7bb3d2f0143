"""A service killed while the helper made its sandbox (kill -9 mid-reset)
never reads the reply, and the release its unit's ExecStopPost= (or its
gunicorn master) ran may have come before the sandbox existed. The helper
rolls back a created sandbox whose reply cannot be delivered; the kill
storm saw one outlive the release by more than 5 s before."""

from __future__ import annotations

import socket

from camg import helper_wire as wire
from helper import server as server_mod
from helper.sandbox_table import Peer


def _serve_one(monkeypatch, verb: str, *, peer_gone: bool) -> list[tuple[str, dict]]:
    calls: list[tuple[str, dict]] = []

    def dispatch(ctx, peer, name, params, blob):
        calls.append((name, params))
        return ({"sandbox_id": "sb1"} if name.endswith("CreateSandbox") else {"ok": 1}), b""

    monkeypatch.setattr(server_mod.verbs, "dispatch", dispatch)
    srv = object.__new__(server_mod.Server)
    srv.ctx, srv.max_blob = None, 1 << 20
    ours, theirs = socket.socketpair()
    wire.send_frame(theirs, {"verb": verb, "params": {}, "owner": "coding"})
    if peer_gone:
        theirs.close()
    try:
        srv._one(ours, Peer(1000, 1000, 1, "default"))
        if not peer_gone:
            assert wire.read_frame(theirs, 1 << 20)[0]["ok"] is True
    finally:
        ours.close()
        if not peer_gone:
            theirs.close()
    return calls


def test_a_sandbox_whose_requester_died_is_destroyed(monkeypatch):
    calls = _serve_one(monkeypatch, wire.PREFIX + "CreateSandbox", peer_gone=True)
    assert calls == [(wire.PREFIX + "CreateSandbox", {}),
                     (wire.PREFIX + "DestroySandbox", {"sandbox_id": "sb1"})]


def test_a_delivered_sandbox_and_other_verbs_are_left_alone(monkeypatch):
    assert _serve_one(monkeypatch, wire.PREFIX + "CreateSandbox", peer_gone=False) == \
        [(wire.PREFIX + "CreateSandbox", {})]
    assert _serve_one(monkeypatch, wire.PREFIX + "Ping", peer_gone=True) == \
        [(wire.PREFIX + "Ping", {})]
