"""Trainers authenticated, episodes owned: tried the way another local user
would, through a real service, with every route and each way in.

Principals: alice and bob are trainers, ops an operator. Each test checks
what it tried left the owner's episode untouched.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import stat
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from camg.web import auth
from camg_client import Client
from camg_client.client import NotFound, PermissionDenied, Unauthorized
from devtools.harness.services import REPO

ROUTES = [  # (method, path, body): every route of the contract but /health and /metrics
    ("GET", "/metadata", None), ("GET", "/schema", None), ("GET", "/tasks", None),
    ("GET", "/episodes", None), ("POST", "/episodes", {}),
    ("GET", "/episodes/{eid}", None), ("DELETE", "/episodes/{eid}", None),
    ("POST", "/episodes/{eid}/step", {"action": {"operation": "guess", "value": 1}}),
    ("POST", "/episodes/{eid}/step/", {"action": {"operation": "guess", "value": 1}}),
    ("GET", "/episodes/{eid}/reference", None), ("POST", "/episodes/{eid}/regrade", {}),
    ("POST", "/episodes/{eid}/fork", {}),
    ("POST", "/reset", {}), ("POST", "/step", {"action": {"operation": "finish"},
                                               "episode_id": "{eid}"}),
    ("GET", "/state?episode_id={eid}", None),
    ("GET", "/counter/splits", None), ("POST", "/counter/tasks", {"split": ""}),
    ("GET", "/ws", None),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                      "params": {}}),
]


def call(url: str, method: str, path: str, body=None, token: str | None = None,
         headers: dict | None = None) -> tuple[int, dict | None, dict]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        sent["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=sent)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode(errors="replace")
    return resp.status, body, dict(resp.getheaders())


@pytest.fixture
def principals(tmp_path):
    path = tmp_path / "trainers.json"
    tokens = {name: auth.add_trainer(path, name, role)
              for name, role in (("alice", "trainer"), ("bob", "trainer"), ("ops", "operator"))}
    return path, tokens


@pytest.fixture
def svc(counter_service, principals):
    path, _ = principals
    return counter_service(auth={"trainers": str(path)}, references=True, capacity=8)


def test_the_trainers_file_holds_hashes_only_and_is_private(principals):
    path, tokens = principals
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for token in tokens.values():
        assert token.startswith(auth.TOKEN_PREFIX) and len(token) >= 40
        assert token not in text and auth.token_hash(token) in text
    with pytest.raises(Exception, match="exists"):
        auth.add_trainer(path, "alice")
    for bad in ("Alice", "", "a b", "x" * 65):
        with pytest.raises(Exception, match="must match"):
            auth.add_trainer(path, bad)


def test_every_route_but_health_and_metrics_refuses_a_missing_or_unknown_token(svc,
                                                                                principals):
    _, tokens = principals
    eid = Client(svc.url, token=tokens["alice"]).create()["episode_id"]
    for token, headers in ((None, None), ("camg_not-a-token", None),
                           (None, {"Authorization": f"Basic {tokens['alice']}"}),
                           (None, {"Authorization": "Bearer"})):
        for method, path, body in ROUTES:
            path = path.replace("{eid}", eid)
            if isinstance(body, dict):
                body = json.loads(json.dumps(body).replace("{eid}", eid))
            status, reply, got = call(svc.url, method, path, body, token, headers)
            assert status == 401, (method, path, status, reply)
            assert reply["error"] == "unauthorized" and "www-authenticate" in {
                k.lower() for k in got}
    for path in ("/health", "/metrics"):
        assert call(svc.url, "GET", path)[0] == 200
    alice = Client(svc.url, token=tokens["alice"])
    state = alice.get(eid)
    assert (state["status"], state["step_count"]) == ("running", 0)


def test_a_websocket_without_a_token_is_refused_at_the_handshake(svc, principals):
    import websockets
    from websockets.exceptions import InvalidStatus

    _, tokens = principals
    url = svc.url.replace("http://", "ws://") + "/ws"

    async def attempt(headers):
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            return json.loads(await ws.recv())

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(attempt({}))
    assert refused.value.response.status_code == 401
    reply = asyncio.run(attempt({"Authorization": f"Bearer {tokens['bob']}"}))
    assert reply["type"] == "observation", reply


def test_another_trainers_episode_is_absent_on_every_route(svc, principals):
    _, tokens = principals
    alice, bob = (Client(svc.url, token=tokens[n]) for n in ("alice", "bob"))
    eid = alice.create()["episode_id"]
    alice.step(eid, {"operation": "guess", "value": 3})
    bob_own = bob.create()["episode_id"]
    for method, path, body in ROUTES:
        if "{eid}" not in path and "{eid}" not in json.dumps(body):
            continue
        path = path.replace("{eid}", eid)
        if isinstance(body, dict):
            body = json.loads(json.dumps(body).replace("{eid}", eid))
        status, reply, _ = call(svc.url, method, path, body, tokens["bob"])
        if path.endswith("/regrade"):  # operators only, the same 403 for any id
            assert (status, reply["error"]) == (403, "permission_denied"), reply
            continue
        assert status == 404, (method, path, status, reply)
        assert reply["error"] == "episode_not_found", reply
        assert eid in reply["message"]  # the same words as an id nobody holds
    # the listing shows bob his own episode only
    assert [e["episode_id"] for e in bob.list()["episodes"]] == [bob_own]
    # an OpenEnv reset carrying alice's episode cookie starts bob's own and
    # closes nothing of hers
    status, reply, _ = call(svc.url, "POST", "/reset", {}, tokens["bob"],
                            {"Cookie": f"camg_episode={eid}"})
    assert status == 200, reply
    state = alice.get(eid)
    assert (state["status"], state["step_count"]) == ("running", 1)
    # the same requests as alice work
    assert alice.fork(eid)["forked_from"] == eid
    assert alice.close(eid)["status"] == "closed"


def test_only_an_operator_lists_everything_reads_references_and_regrades(svc, principals):
    _, tokens = principals
    alice, ops = Client(svc.url, token=tokens["alice"]), Client(svc.url, token=tokens["ops"])
    eid = alice.create()["episode_id"]
    with pytest.raises(PermissionDenied, match="operator"):
        alice.reference(eid)
    action = ops.reference(eid)["action"]
    assert action is not None
    assert eid in [e["episode_id"] for e in ops.list()["episodes"]]
    done = alice.step(eid, action)
    if not done["done"]:
        done = alice.step(eid, {"operation": "finish"})
    assert done["reward"] == 1.0
    with pytest.raises(PermissionDenied, match="operator"):
        alice.regrade(eid)
    assert ops.regrade(eid)["reward"] == 1.0
    # an operator's fork of alice's episode is the operator's own
    other = alice.create()["episode_id"]
    child = ops.fork(other)["episode_id"]
    with pytest.raises(NotFound):
        alice.get(child)


def test_mcp_sessions_belong_to_the_principal_that_opened_them(svc, principals):
    _, tokens = principals
    base = {"Accept": "application/json, text/event-stream",
            "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    status, reply, got = call(svc.url, "POST", "/mcp", init, tokens["alice"], base)
    assert status == 200, reply
    session = {k.lower(): v for k, v in got.items()}["mcp-session-id"]
    eid = reply["result"]["_meta"]["camg/episode"]["episode_id"]
    step = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "guess", "arguments": {"value": 5}}}
    headers = {**base, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
    for method, body in (("POST", step), ("DELETE", None)):
        status, reply, _ = call(svc.url, method, "/mcp", body, tokens["bob"], headers)
        assert status == 404, (method, status, reply)
    alice = Client(svc.url, token=tokens["alice"])
    assert alice.get(eid)["step_count"] == 0
    # openenv's HTTP sessions: bob cannot use or close alice's
    status, reply, _ = call(svc.url, "POST", "/mcp", {
        "jsonrpc": "2.0", "id": 3, "method": "openenv/session/create", "params": {}},
        tokens["alice"])
    sid, oeid = reply["result"]["session_id"], reply["result"]["episode_id"]
    for method in ("tools/call", "openenv/session/close"):
        status, reply, _ = call(svc.url, "POST", "/mcp", {
            "jsonrpc": "2.0", "id": 4, "method": method,
            "params": {"session_id": sid, "name": "guess", "arguments": {"value": 1}}},
            tokens["bob"])
        assert "error" in reply and "Unknown session_id" in reply["error"]["message"], reply
    assert alice.get(oeid)["step_count"] == 0
    status, reply, _ = call(svc.url, "POST", "/mcp", {
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"session_id": sid, "name": "guess", "arguments": {"value": 1}}},
        tokens["alice"])
    assert reply["result"]["step"] == 1, reply


def test_a_revoked_token_stops_working_without_a_restart(svc, principals):
    path, tokens = principals
    bob = Client(svc.url, token=tokens["bob"])
    bob.create()
    assert auth.revoke(path, "bob")
    deadline = time.monotonic() + 5
    while True:
        try:
            bob.list()
        except Unauthorized:
            break
        assert time.monotonic() < deadline, "the revoked token still works"
        time.sleep(0.1)
    carol = auth.add_trainer(path, "carol")
    deadline = time.monotonic() + 5
    while True:
        try:
            assert Client(svc.url, token=carol).list()["episodes"] == []
            break
        except Unauthorized:
            assert time.monotonic() < deadline, "a new token was not picked up"
            time.sleep(0.1)


def test_tokens_never_reach_logs_records_or_metrics(svc, principals):
    _, tokens = principals
    alice = Client(svc.url, token=tokens["alice"])
    eid = alice.create()["episode_id"]
    alice.step(eid, {"operation": "finish"})
    assert call(svc.url, "GET", "/episodes", None, "camg_wrong")[0] == 401
    status, metrics, _ = call(svc.url, "GET", "/metrics")
    assert status == 200 and "camg_" in metrics
    state_dir = Path(svc.config["state_dir"])
    texts = [svc.output(), metrics] + [p.read_text(errors="replace")
                               for p in state_dir.rglob("*") if p.is_file()]
    for token in (*tokens.values(), "camg_wrong"):
        assert not any(token in text for text in texts)
    record = svc.outcomes()[-1]
    assert record["episode_id"] == eid


def test_a_deployment_turns_authentication_off_only_by_saying_so(counter_service, tmp_path,
                                                                 monkeypatch):
    monkeypatch.delenv("CAMG_TOKEN")
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("CAMG_TOKEN_FILE", str(tmp_path / "empty"))  # no token at all
    off = counter_service(auth={"required": False})
    assert call(off.url, "GET", "/health")[1]["auth"] == "off"
    assert call(off.url, "POST", "/episodes", {})[0] == 201
    # on, with nobody in its trainers file: degraded, and says what to do
    on = counter_service(auth={"trainers": str(tmp_path / "nobody.json")}, wait=False)
    deadline = time.monotonic() + 30
    while True:
        status, body, _ = (call(on.url, "GET", "/health") if _listening(on.url)
                           else (None, None, None))
        if status is not None:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert status == 503 and body["auth"] == "tokens"
    assert any("camg trainer add" in r for r in body["reasons"]), body


def _listening(url: str) -> bool:
    try:
        call(url, "GET", "/health")
    except OSError:
        return False
    return True


def test_camg_trainer_add_prints_the_token_once_and_list_and_revoke_work(tmp_path):
    path = tmp_path / "etc" / "trainers.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def camg(*args):
        return subprocess.run([sys.executable, "-c", "import sys; from camg.status import cli; "
                               "sys.exit(cli())", "trainer", *args,
                               "--file", str(path), "--owner", "root"],
                              capture_output=True, text=True, env=env, cwd=REPO)

    added = camg("add", "dana")
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert token.startswith(auth.TOKEN_PREFIX) and "shown only now" in added.stderr
    assert auth.TokenStore(path).principal(token) == auth.Principal("dana", "trainer")
    assert camg("add", "dana").returncode == 2
    assert camg("add", "ops", "--role", "operator").returncode == 0
    listed = camg("list")
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        ["dana", "trainer"], ["ops", "operator"]]
    assert token not in listed.stdout
    assert camg("revoke", "dana").returncode == 0
    assert camg("revoke", "dana").returncode == 1
    assert auth.TokenStore(path).principal(token) is None


def test_the_client_finds_its_token_where_the_readme_says(tmp_path, monkeypatch):
    from camg_client import token as tokens

    monkeypatch.delenv("CAMG_TOKEN", raising=False)
    monkeypatch.delenv("CAMG_TOKEN_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tokens.resolve() is None
    (tmp_path / ".config" / "camg").mkdir(parents=True)
    (tmp_path / ".config" / "camg" / "token").write_text("camg_home\n")
    assert tokens.resolve() == "camg_home"
    (tmp_path / "t").write_text("camg_file")
    monkeypatch.setenv("CAMG_TOKEN_FILE", str(tmp_path / "t"))
    assert tokens.resolve() == "camg_file"
    monkeypatch.setenv("CAMG_TOKEN", "camg_env")
    assert tokens.resolve() == "camg_env"
    assert tokens.resolve("camg_arg") == "camg_arg"
    monkeypatch.delenv("CAMG_TOKEN")
    monkeypatch.setenv("CAMG_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        tokens.resolve()


def test_each_client_without_a_token_is_refused(svc, monkeypatch, tmp_path):
    """The same clients the suite drives episodes with (each with the token,
    in its own tests) are refused without one."""
    import httpx2
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client
    from openenv.core import GenericEnvClient

    from camg_client import AsyncClient

    monkeypatch.delenv("CAMG_TOKEN", raising=False)
    (tmp_path / "none").write_text("")
    monkeypatch.setenv("CAMG_TOKEN_FILE", str(tmp_path / "none"))
    with pytest.raises(Unauthorized):
        Client(svc.url).create()

    async def async_client():
        async with AsyncClient(svc.url) as client:
            await client.create()
    with pytest.raises(Unauthorized):
        asyncio.run(async_client())
    with pytest.raises(ConnectionError, match="401"):
        with GenericEnvClient(base_url=svc.url).sync() as env:
            env.reset()

    statuses: list[int] = []

    async def seen(response):
        statuses.append(response.status_code)

    async def mcp_sdk():
        # the SDK reports a refused initialize as a generic error: the
        # answers' statuses are read off its HTTP client
        async with httpx2.AsyncClient(event_hooks={"response": [seen]}) as http:
            transport = streamable_http_client(svc.url + "/mcp", http_client=http)
            async with McpClient(transport) as client:
                await client.list_tools()
    with pytest.raises(BaseException):
        asyncio.run(mcp_sdk())
    assert statuses and set(statuses) == {401}, statuses
