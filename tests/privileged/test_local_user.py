"""Another local user on the service host: an ordinary account with no
token and no group membership, tried against a real service with auth on
and the root helper, the way an outside tester tried it. Every answer is a
refusal, the owner's episode is untouched, and the service and the helper
are healthy afterwards (the slow-connection and deep-nesting probes too).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from camg.web import auth
from camg.helper_client import HelperClient
from camg_client import Client

STRANGER = 4243  # no passwd entry, no group: what useradd gives a new person

ROUTES = [("GET", "/episodes", None), ("POST", "/episodes", {}),
          ("GET", "/episodes/{eid}", None), ("DELETE", "/episodes/{eid}", None),
          ("POST", "/episodes/{eid}/step", {"action": {"operation": "finish"}}),
          ("GET", "/episodes/{eid}/reference", None),
          ("POST", "/episodes/{eid}/regrade", {}), ("POST", "/episodes/{eid}/fork", {}),
          ("GET", "/metadata", None), ("GET", "/tasks", None), ("POST", "/reset", {}),
          ("GET", "/state?episode_id={eid}", None),
          ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                            "params": {}})]


def _as_stranger(fn) -> dict:
    """``fn()``'s JSON-able result, run in a child with the stranger's uid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out: dict = {}
        try:
            os.setgroups([])
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            out = fn()
        except BaseException as exc:
            out = {"error": repr(exc)}
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the service hung up on ``sock`` (whatever it said first)."""
    sock.settimeout(5)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except OSError:  # still open after 5 s
        return False
    finally:
        sock.close()


def _request(url: str, method: str, path: str, body=None, headers=None) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                    **(headers or {})})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_local_user_without_a_token_is_refused_everywhere(counter_service, helper):
    shared = Path(tempfile.mkdtemp())  # traversable by anyone: the file's mode decides
    shared.chmod(0o755)
    trainers = shared / "trainers.json"
    alice = auth.add_trainer(trainers, "alice")
    svc = counter_service(auth={"trainers": str(trainers)},
                          limits={"header_timeout_s": 1, "body_timeout_s": 1})
    owner = Client(svc.url, token=alice)
    eid = owner.create()["episode_id"]
    owner.step(eid, {"operation": "guess", "value": 4})

    def stranger() -> dict:
        out: dict = {"routes": {}}
        for method, path, body in ROUTES:
            path = path.replace("{eid}", eid)
            out["routes"][f"{method} {path}"] = _request(svc.url, method, path, body)
        # guessing at a token: the scheme without one, another's name
        out["guessed"] = [_request(svc.url, "GET", "/episodes", headers={"Authorization": h})
                          for h in ("Bearer", "Bearer alice", f"Bearer {eid}", "Basic YWxpY2U6")]
        try:
            trainers.read_text()
            out["trainers_file"] = "read"
        except PermissionError:
            out["trainers_file"] = "denied"
        # the helper: its socket's mode first, its peer check behind it
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(helper.socket)
            HelperClient(helper.socket, owner="stranger").ping()
            out["helper"] = "served"
        except PermissionError:
            out["helper"] = "socket_denied"
        except Exception as exc:
            out["helper"] = getattr(exc, "name", repr(exc))
        finally:
            probe.close()
        # slow peers: headers that never finish, held past the header timeout
        slow = []
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", int(svc.url.rsplit(":", 1)[1])))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(sock)
        out["health_meanwhile"] = _request(svc.url, "GET", "/health")
        time.sleep(3)
        out["slow_closed"] = sum(_closed_by_peer(sock) for sock in slow)
        deep = b'{"task_id":' + b"[" * 990 + b"]" * 990 + b"}"
        host, port = svc.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/episodes", body=deep, headers={"Content-Type": "application/json"})
        out["deep_without_token"] = conn.getresponse().status
        return out

    got = _as_stranger(stranger)
    assert "error" not in got, got
    assert set(got["routes"].values()) == {401}, got["routes"]
    assert got["guessed"] == [401, 401, 401, 401]
    assert got["trainers_file"] == "denied"
    assert got["helper"] in ("socket_denied", "permission_denied"), got["helper"]
    assert got["health_meanwhile"] == 200
    assert got["slow_closed"] == 100
    assert got["deep_without_token"] == 401
    # the same deep body with a token is the contract's 400, not a 500
    deep = b'{"task_id":' + b"[" * 990 + b"]" * 990 + b"}"
    assert _request(svc.url, "POST", "/episodes", None, {"Authorization": f"Bearer {alice}"}) \
        == 201
    host, port = svc.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/episodes", body=deep, headers={"Authorization": f"Bearer {alice}"})
    assert conn.getresponse().status == 400
    # the owner's episode is as it was; the service and the helper are well
    state = owner.get(eid)
    assert (state["status"], state["step_count"]) == ("running", 1)
    assert owner.health()["status"] == "healthy"
    assert helper.client().ping()["probes_ok"]
    trainers.unlink()
    shared.rmdir()
