"""The gunicorn worker class camg.serve runs (camg/serving/http_worker.py): chosen
from a closed table, refused before the arbiter starts when unknown, and
every class in the table serves the same contract (HTTP episode, OpenEnv
WebSocket, graceful shutdown) under a real ``python -m camg.serve``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websockets

from camg import serve
from camg.serving import http_worker
from camg.errors import ConfigError
from camg_client import Client, InvalidAction
from devtools.harness.auth import headers as auth_headers
from devtools.harness.services import REPO, ServiceProcess, configure_counter

GUESS = {"operation": "guess", "value": -1}


def test_the_default_is_uvicorn_on_c_parsers(monkeypatch):
    monkeypatch.delenv(http_worker.ENV, raising=False)
    assert http_worker.selected() == http_worker.DEFAULT == "uvicorn"
    worker = http_worker.UvicornWorker
    assert worker.CONFIG_KWARGS["http"] == "httptools" and worker.CONFIG_KWARGS["loop"] == "uvloop"
    # An environment that fails to start must stop the service.
    assert worker.CONFIG_KWARGS["lifespan"] == "on"


def test_an_unknown_worker_is_refused(monkeypatch):
    monkeypatch.setenv(http_worker.ENV, "sync")
    with pytest.raises(ConfigError, match="CAMG_HTTP_WORKER"):
        http_worker.selected()


@pytest.mark.parametrize("name", sorted(http_worker.WORKERS))
def test_every_worker_keeps_gunicorns_process_settings(tmp_path, name):
    from camg.config import service_config as cfg
    config = cfg.load_service_config(str(configure_counter(tmp_path)))
    options = serve.gunicorn_options(config, name)
    assert options["workers"] == 1 and options["bind"] == [f"127.0.0.1:{config.port}"]
    assert options["graceful_timeout"] == 90 and callable(options["pre_fork"])
    assert options["worker_class"] == http_worker.WORKERS[name]["worker_class"]


def test_serve_refuses_an_unknown_worker_before_serving(tmp_path):
    path = configure_counter(tmp_path)
    out = subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(path)],
                         env={"PYTHONPATH": str(REPO), http_worker.ENV: "bogus", "PATH": "/usr/bin:/bin"},
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "CAMG_HTTP_WORKER='bogus'" in out.stderr


async def _ws_episode(url: str) -> list[dict]:
    replies = []
    async with websockets.connect(url.replace("http", "ws") + "/ws",
                                  additional_headers=auth_headers()) as ws:
        for message in ({"type": "reset", "data": {"episode_id": "w-1"}},
                        {"type": "step", "data": GUESS}, {"type": "state"}):
            await ws.send(json.dumps(message))
            replies.append(json.loads(await ws.recv()))
    return replies


@pytest.mark.parametrize("name", sorted(http_worker.WORKERS))
def test_every_worker_serves_the_same_contract(tmp_path, name):
    svc = ServiceProcess(configure_counter(tmp_path, limits={"max_steps": 50}),
                         env={http_worker.ENV: name}).wait_ready()
    try:
        client = Client(svc.url)
        eid = client.create()["episode_id"]
        step = client.step(eid, GUESS)
        assert step["done"] is False and step["step"] == 1
        with pytest.raises(InvalidAction) as bad:
            client.step(eid, {"operation": "fly"})
        assert bad.value.status == 422
        replies = asyncio.run(_ws_episode(svc.url))
        assert [r["type"] for r in replies] == ["observation", "observation", "state"]
        assert replies[2]["data"]["episode_id"] == "w-1"
        client.close_connection()
        # Graceful stop: the open episode is closed and recorded, exit 0.
        assert svc.stop(signal.SIGTERM) == 0
        # (the WebSocket's episode may have closed on its hang-up already)
        assert eid in {o["episode_id"] for o in svc.outcomes()
                       if o["reason"] == "service stopping"}
    finally:
        svc.stop()


def test_the_uvicorn_worker_leaves_when_the_arbiter_is_killed(tmp_path):
    svc = ServiceProcess(configure_counter(tmp_path), env={http_worker.ENV: "uvicorn"}).wait_ready()
    master = svc.proc.pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1
    worker = int(children[0])
    try:
        svc.proc.kill()
        svc.proc.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived its arbiter"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)
        svc.stop()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
