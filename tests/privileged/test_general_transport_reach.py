"""Inside a General container, the agent's uid cannot reach the root transport.

The transport (root) drives the episode; the agent's shell runs as uid 2000
in the same container. Played through the service as the agent: no TCP
listener in the container's network namespace and no port of 127.0.0.1 or
::1 that accepts; the transport's Unix socket unreachable (its directory is
root's, 0700); no listening Unix socket, path or abstract, that accepts.
The episode goes on to the gold patch's 1.0. Then, through the helper as
root, the directory and socket are opened to everyone: the transport still
serves no peer but root (SO_PEERCRED), and the mediator's session goes on.
"""

from __future__ import annotations

import base64
import json

import pytest

from camg_client import Client, ServiceError
from general_fixtures import tasks_of

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

SOCKET = "/run/mimo-transport/transport.sock"

# Run as the agent (uid 2000) in the container, stdlib only.
PROBE = r"""
import errno, json, socket, sys
path = sys.argv[1]
out = {"uid": __import__("os").getuid()}
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        f = row.split()
        if f[3] == "0A":
            listening.add(int(f[1].rsplit(":", 1)[1], 16))
out["tcp_listening"] = sorted(listening)
accepted = []
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    for port in range(1, 65536):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(0.5)
        try:
            s.connect((host, port))
            # (a port in the ephemeral range can be given to this very
            # socket: TCP's simultaneous open connects it to itself)
            if s.getsockname()[:2] != s.getpeername()[:2]:
                accepted.append(f"{host}:{port}")
        except OSError:
            pass
        finally:
            s.close()
out["tcp_accepted"] = accepted
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
    out["transport_socket"] = "CONNECTED"
except OSError as e:
    out["transport_socket"] = errno.errorcode.get(e.errno, str(e.errno))
try:
    __import__("os").stat(path)
    out["stat"] = "visible"
except OSError as e:
    out["stat"] = errno.errorcode.get(e.errno, str(e.errno))
unix = []
for row in open("/proc/net/unix").read().splitlines()[1:]:
    f = row.split()
    if len(f) >= 8 and int(f[3], 16) & 0x10000:  # __SO_ACCEPTCON: a listener
        name = f[7]
        address = "\0" + name[1:] if name.startswith("@") else name
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(address)
            unix.append(name)
        except OSError:
            pass
        finally:
            s.close()
out["unix_accepted"] = unix
print("PROBE" + json.dumps(out))
"""

# Connects to the socket (once its directory is opened) and asks for a session.
HANDSHAKE = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    answer = s.recv(4096)
except (ConnectionResetError, BrokenPipeError):
    answer = b""
print("ANSWER" + repr(answer[:40]))
"""


def _python(script: str, *args: str) -> str:
    data = base64.b64encode(script.encode()).decode()
    return (f"echo {data} | base64 -d > /tmp/.probe.py && python3 /tmp/.probe.py "
            + " ".join(args) + "; rm -f /tmp/.probe.py")


def shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


def _tagged(output: str, tag: str) -> str:
    line = next((ln for ln in output.splitlines() if ln.startswith(tag)), None)
    assert line is not None, output
    return line[len(tag):]


def test_agent_cannot_reach_the_transport(general_service, general_demo, general_helper,
                                          general_prepared):
    from camg.sandboxes.containers import ContainerClient

    client = Client(general_service.url)
    containers = ContainerClient(general_helper.socket, owner="general")
    task = tasks_of(general_prepared, "opensource-code")[0]
    gold = (general_demo["out"] / "gold" / f"{task['task_id']}.patch").read_text()
    episode = client.create(task_id=task["task_id"], wait=120)
    eid = episode["episode_id"]
    try:
        reply = client.step(eid, shell(_python(PROBE, SOCKET)))
        found = json.loads(_tagged(reply["observation"]["output"], "PROBE"))
        assert found["uid"] == 2000, found
        assert found["tcp_listening"] == [] and found["tcp_accepted"] == [], found
        assert found["transport_socket"] in ("EACCES", "ENOENT"), found
        assert found["stat"] in ("EACCES", "ENOENT"), found
        assert found["unix_accepted"] == [], found
        assert not reply["done"], reply

        # The second line: the directory and socket opened to every uid by
        # root, the transport still serves root's connections alone.
        held = [c for c in containers.list() if c["episode_id"] == eid]
        assert len(held) == 1, containers.list()
        cid = held[0]["container_id"]
        opened = containers.exec(cid, f"chmod 0755 {SOCKET.rsplit('/', 1)[0]} && "
                                      f"chmod 0666 {SOCKET} && echo OPENED", user="root")
        assert "OPENED" in opened.output, opened
        answer = containers.exec(cid, _python(HANDSHAKE, SOCKET), user="agent")
        assert _tagged(answer.output, "ANSWER") == "b''", answer.output

        # The episode is unaffected: the gold patch earns 1.0.
        data = base64.b64encode(gold.encode()).decode()
        applied = client.step(eid, shell(f"echo {data} | base64 -d | git apply && echo APPLIED"))
        assert "APPLIED" in applied["observation"]["output"], applied
        done = client.step(eid, {"operation": "finish"})
        assert done["done"] and done["reward"] == 1.0 and done["failure_class"] is None, done
    finally:
        try:
            client.close(eid)
        except ServiceError:  # (already closed by its terminal step)
            pass
        containers.close()
