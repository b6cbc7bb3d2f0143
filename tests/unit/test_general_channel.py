"""The service's channel against the real in-container transport server
(mimoagent.transport.wsserver) on a Unix socket, no container: the
OpenEnv /ws protocol, sticky terminal, error mapping; and the server's
answers message for message against openenv's own create_app (the protocol
it replaces), one session at a time, /health; who may connect (a root-only
directory, root's peer credentials only). Root: the transport runs
commands as uid 2000."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import threading
import time

import pytest

from camg import errors
from environments.general.channel import TransportChannel, observation_of
from tests.support import mimo_tasks
from tests.support.mimo_tasks import GOLD, world_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as uid 2000 (CI runs as root)")


def _code_env(prefix: str):
    from mimoagent.transport import software

    base = world_dir(prefix)
    cwd = base / "testbed"
    mimo_tasks.code_task(base, cwd=cwd)
    return base, software.bind(base / "task", workspaces=(cwd,))


@pytest.fixture
def served():
    from mimoagent.transport import software
    from mimoagent.transport.wsserver import Server

    base, env = _code_env("mimo-channel.")
    server = Server(env, software.ShellAction, str(base / "run" / "transport" / "t.sock"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.path
    server.close()
    thread.join(10)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def openenv_served():
    """openenv's create_app + uvicorn over the same transport class: the reference."""
    import uvicorn
    from openenv.core.env_server import Action, Environment, Observation, create_app
    from pydantic import ConfigDict

    base, env = _code_env("mimo-openenv.")

    # pydantic twins of the transport's types: what the transport declared before
    # it dropped openenv (transport/software.py's ShellAction, ShellObservation).
    from typing import Literal

    from pydantic import Field

    class PydanticShell(Action):
        operation: Literal["shell", "finish"]
        command: str = Field(default="", max_length=16000)

    class PydanticObservation(Observation):
        model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
        task_id: str
        output: str
        exit_code: int | None = None

    class Adapted(env, Environment):
        def step(self, action, timeout_s=None, **kwargs):
            from mimoagent.transport import software
            return _twin(super().step(software.ShellAction(**action.model_dump(exclude={"metadata"}))))

        def reset(self, *args, **kwargs):
            return _twin(super().reset(*args, **kwargs))

    def _twin(obs):
        return PydanticObservation(**obs.serialize()["observation"], reward=obs.reward, done=obs.done)

    app = create_app(Adapted, PydanticShell, PydanticObservation, env_name="t", max_concurrent_envs=1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)
    shutil.rmtree(base, ignore_errors=True)


def _socket(where, timeout=None) -> socket.socket:
    """A socket connected to the transport (a Unix socket path) or to openenv's (a port)."""
    if isinstance(where, int):
        return socket.create_connection(("127.0.0.1", where), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(where)
    return sock


def channel(where):
    return TransportChannel(_socket(where))


def test_episode_over_the_channel(served):
    ch = channel(served)
    try:
        obs, reward, done = observation_of(ch.request("reset", {"task_id": "calc-001"}, 60))
        assert obs["task_id"] == "calc-001" and not done
        obs, _, done = observation_of(ch.request("step", {"operation": "shell", "command": "id -u"}, 60))
        assert obs["output"].strip() == "2000" and obs["exit_code"] == 0 and not done
        ch.request("step", {"operation": "shell",
                            "command": f"cat > /tmp/g.$$ <<'EOF'\n{GOLD}EOF\ngit apply /tmp/g.$$"}, 60)
        obs, reward, done = observation_of(ch.request("step", {"operation": "finish"}, 120))
        assert done and reward == 1.0
        again = observation_of(ch.request("step", {"operation": "shell", "command": "echo x"}, 60))
        assert again[2] and again[1] == 1.0
    finally:
        ch.close()
        ch.close()  # idempotent


def test_grader_failure_and_bad_action_map_to_camg_errors(served):
    ch = channel(served)
    try:
        ch.request("reset", {}, 60)
        with pytest.raises(errors.InvalidAction):
            ch.request("step", {"operation": "dance"}, 60)
        ch.request("step", {"operation": "shell", "command": "rm -rf .git"}, 60)
        with pytest.raises(errors.GraderError):
            ch.request("step", {"operation": "finish"}, 120)
    finally:
        ch.close()


def test_wrong_task_is_an_infra_failure(served):
    ch = channel(served)
    try:
        with pytest.raises(errors.InfraFailure):
            ch.request("reset", {"task_id": "another"}, 60)
    finally:
        ch.close()


def test_lost_transport_is_sandbox_died(served):
    ch = channel(served)
    ch.request("reset", {}, 60)
    ch._ws.socket.shutdown(socket.SHUT_RDWR)
    with pytest.raises(errors.SandboxDied):
        ch.request("step", {"operation": "shell", "command": "true"}, 10)
    ch.close()


def _raw(where):
    from websockets.sync.client import connect

    return connect("ws://mimo-transport/ws", sock=_socket(where), open_timeout=30,
                   max_size=1 << 24, proxy=None, compression=None, ping_interval=None)


#: each message as text, and what of the answer both servers must agree on
_SCRIPT = [
    json.dumps({"type": "reset", "data": {"task_id": "calc-001"}}),
    json.dumps({"type": "step", "data": {"operation": "shell", "command": "printf 'a\\nb'; exit 3"}}),
    json.dumps({"type": "step", "data": {"operation": "dance"}}),
    json.dumps({"type": "step", "data": {"operation": "shell", "command": 5}}),
    json.dumps({"type": "step", "data": {"operation": "shell", "extra": 1}}),
    json.dumps({"type": "step", "data": {"operation": "shell", "command": "x" * 70000}}),
    json.dumps({"type": "state"}),
    json.dumps({"type": "levitate"}),
    "{not json",
    json.dumps({"type": "step", "data": {"operation": "shell", "command": "echo ok"}}),
]


def _comparable(raw: str) -> dict:
    reply = json.loads(raw)
    data = dict(reply["data"])
    if reply["type"] == "error":
        if "errors" in data:  # pydantic adds input/ctx/url; the service reads type and loc
            data["errors"] = sorted((e["type"], tuple(e["loc"])) for e in data["errors"])
        if data.get("code") == "INVALID_JSON":
            data["message"] = data["message"].split(":")[0]  # json's and pydantic's wording
    if reply["type"] == "state":
        data.pop("episode_id")
    if reply["type"] == "observation":  # each server has a workspace of its own
        obs = data["observation"] = dict(data["observation"])
        obs["output"] = re.sub(r"/tmp/mimo-[a-z]+\.[a-z0-9_]+/", "/WORLD/", obs["output"])
    return {"type": reply["type"], "data": data}


def test_same_answers_as_openenv_create_app(served, openenv_served):
    answers = {}
    for name, port in (("ours", served), ("openenv", openenv_served)):
        with _raw(port) as ws:
            replies = []
            for message in _SCRIPT:
                ws.send(message)
                replies.append(_comparable(ws.recv(timeout=60)))
            answers[name] = replies
    assert answers["ours"] == answers["openenv"]
    ours = answers["ours"]
    assert ours[1]["data"]["observation"]["exit_code"] == 3
    assert [r["data"].get("code") for r in ours[2:6]] == ["VALIDATION_ERROR"] * 4
    assert ours[6]["data"]["step_count"] == 1 and ours[7]["data"]["code"] == "UNKNOWN_TYPE"


def test_one_session_at_a_time_and_health(served):
    with _raw(served) as first:
        first.send(json.dumps({"type": "state"}))
        assert json.loads(first.recv(timeout=30))["type"] == "state"
        with _raw(served) as second:
            refused = json.loads(second.recv(timeout=30))
            assert refused["data"]["code"] == "CAPACITY_REACHED"
    with _raw(served) as later:  # the first session ended: a new one is served
        later.send(json.dumps({"type": "state"}))
        assert json.loads(later.recv(timeout=30))["data"]["step_count"] == 0
    with _socket(served, timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"healthy"}')


def test_protocol_violations_close_the_connection(served):
    """A client frame without a mask breaks RFC 6455: the server closes (1002)."""
    import base64
    import struct

    with _socket(served, timeout=10) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        sock.sendall(struct.pack("!BB", 0x81, 2) + b"{}")  # unmasked text frame
        closing = sock.recv(16)
        assert closing[0] == 0x88 and struct.unpack("!H", closing[2:4])[0] == 1002


def test_listens_in_a_root_only_directory_and_serves_root_alone(served):
    """The socket's directory is root's, 0700, so the agent's uid cannot
    even reach the socket; a peer of another uid that did (here: a server
    that serves only uid 4242, reached by root) is closed unread."""
    import stat
    import subprocess
    import sys

    directory = os.path.dirname(served)
    info = os.lstat(directory)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o700
    sock_info = os.lstat(served)
    assert stat.S_ISSOCK(sock_info.st_mode) and stat.S_IMODE(sock_info.st_mode) == 0o600
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(e.errno)\n"
             "else:\n    print('CONNECTED')\n")
    out = subprocess.run([sys.executable, "-c", probe, served], capture_output=True, text=True,
                         user=2000, group=2000, extra_groups=[], timeout=30)
    assert out.stdout.strip() == str(errno.EACCES), out


def test_a_peer_of_another_uid_is_closed_unread(tmp_path):
    from mimoagent.transport.wsserver import Server

    server = Server(lambda: None, dict, str(tmp_path / "d" / "t.sock"), peer_uid=4242)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with _socket(server.path, timeout=10) as sock:
            try:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = sock.recv(4096)
            except (ConnectionResetError, BrokenPipeError):  # closed with our bytes unread
                answer = b""
            assert answer == b""  # closed without an answer
        assert server.refused == 1
    finally:
        server.close()
        thread.join(10)


def test_a_fresh_directory_each_start(tmp_path):
    """A forked container's filesystem carries its parent's socket: the
    transport starts from a new directory; one holding anything else is
    refused, not removed."""
    from mimoagent.transport.listener import listen

    directory = tmp_path / "run" / "t"
    path = str(directory / "t.sock")
    with listen(path) as first:
        pass
    os.chmod(directory, 0o777)
    assert (directory / "t.sock").exists()  # the stale socket inode a fork would carry
    with listen(path) as second:
        assert os.listdir(directory) == ["t.sock"] and first.fileno() == -1
        assert os.stat(directory).st_mode & 0o777 == 0o700
        assert second.getsockname() == path
    (directory / "planted").write_text("x")
    with pytest.raises(FileExistsError):
        listen(path)
    assert sorted(os.listdir(directory)) == ["planted", "t.sock"]
