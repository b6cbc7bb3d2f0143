"""The service's channel against the real in-container transport app
(openenv create_app + uvicorn) on a loopback port, no container: the
OpenEnv /ws protocol, sticky terminal, error mapping. Root: the transport
runs commands as uid 2000."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest

from camg import errors
from daemons.general.channel import TransportChannel, observation_of
from tests.support import mimo_tasks
from tests.support.mimo_tasks import GOLD, world_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as uid 2000 (CI runs as root)")


@pytest.fixture
def served():
    import uvicorn
    from openenv.core.env_server import create_app

    from mimoagent.transport import software

    base = world_dir("mimo-channel.")
    cwd = base / "testbed"
    mimo_tasks.code_task(base, cwd=cwd)
    env = software.bind(base / "task", workspaces=(cwd,))
    app = create_app(env, software.ShellAction, software.ShellObservation, env_name="t",
                     max_concurrent_envs=1)
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


def channel(port):
    return TransportChannel(socket.create_connection(("127.0.0.1", port)))


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
