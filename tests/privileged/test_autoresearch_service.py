"""AutoResearch as a real ``python -m camg.serve`` process: fresh state per
invocation (--check-clean), the supervised grader (killing it stops the
service), a crash's sandboxes released by the next check, the stock
OpenEnv client running an episode and a no-op over MCP to 0. Configured
for real with camg.configure.
"""

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

import conftest as pc
from camg.configure import configure
from tests.support.services import REPO, ServiceProcess, clean_git_tree, free_port
from test_autoresearch_episodes import (  # noqa: F401  (module fixtures)
    ar_helper, reference, research_image, roots, settings_for)
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


@pytest.fixture(scope="module")
def config_path(roots, ar_helper, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ar-service")
    lock = tmp / "requirements.lock"
    lock.write_text("numpy==2.4.6\nscikit-learn==1.9.1\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": ar_helper.socket, "executables": {"python": sys.executable},
        "environments": {"autoresearch": {
            "manifest": str(roots["manifest"]), "port": free_port(), "capacity": 2,
            # Research budgets: a command may take minutes, the server's
            # deadlines must cover it.
            "limits": {"action_timeout_s": 400, "idle_ttl_s": 600},
            "settings": settings_for(roots)}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "autoresearch.json"


def state_dir(config_path: Path) -> Path:
    return Path(json.loads(config_path.read_text())["state_dir"])


def check_clean(config_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(config_path),
                           "--check-clean"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def wait_exit(svc: ServiceProcess, timeout: float = 90) -> int:
    try:
        return svc.proc.wait(timeout)
    finally:
        svc.stop()


def _grader_pid(config_path: Path) -> int:
    return json.loads((state_dir(config_path) / "run.json").read_text())["grader_pid"]


def test_unchecked_state_dir_refused_naming_check_clean(config_path):
    state = state_dir(config_path)
    state.mkdir(parents=True, exist_ok=True)
    (state / "clean.json").unlink(missing_ok=True)
    svc = ServiceProcess(config_path)
    status = wait_exit(svc)
    assert status != 0
    assert "--check-clean" in svc.output(), svc.output()[-3000:]
    assert not (state / "run.json").exists()


def test_check_clean_serve_and_killing_the_grader_stops_the_service(config_path, ar_helper):
    first = check_clean(config_path)
    assert first.returncode == 0, first.stderr
    again = check_clean(config_path)
    assert again.returncode == 0 and "nothing of a previous run" in again.stdout + again.stderr
    svc = ServiceProcess(config_path).wait_ready(120)
    try:
        from camg_client import Client
        client = Client(svc.url, timeout=120)
        meta = client.metadata()
        assert meta["environment"] == "autoresearch" and meta["task_count"] == 4
        assert "grader" in meta["hashes"]
        created = client.create(task_id="digits")
        client.step(created["episode_id"], {"operation": "background", "command": "sleep 300"})
        grader = _grader_pid(config_path)
        os.kill(grader, signal.SIGKILL)
        status = wait_exit(svc)
    finally:
        svc.stop()
    assert status == 1, svc.output()[-3000:]
    assert "the private grader exited" in svc.output()
    # The episode in flight ended without a reward (masked, never a fake 0).
    [record] = [r for r in svc.outcomes() if r["episode_id"] == created["episode_id"]]
    assert record["reward"] is None and record["failure_class"], record
    # The episode in flight was closed; its sandbox is gone or named by the
    # ledger, and the next check leaves nothing behind.
    result = check_clean(config_path)
    assert result.returncode == 0, result.stderr
    with ar_helper.client(owner="autoresearch") as helper:
        assert helper.list_sandboxes() == []
    assert not (state_dir(config_path) / "run.json").exists()


def test_crash_leaves_sandboxes_that_check_clean_releases(config_path, ar_helper):
    assert check_clean(config_path).returncode == 0
    svc = ServiceProcess(config_path).wait_ready(120)
    try:
        from camg_client import Client
        client = Client(svc.url, timeout=120)
        client.create(task_id="diabetes")
        ledger = json.loads((state_dir(config_path) / "run.json").read_text())
        assert len(ledger["sandboxes"]) == 1
        workers = [int(p) for p in os.listdir("/proc") if p.isdigit()
                   and _ppid(int(p)) == svc.proc.pid]
        # kill -9 of the whole service: no shutdown code runs.
        for pid in workers + [svc.proc.pid]:
            os.kill(pid, signal.SIGKILL)
        svc.proc.wait(30)
    finally:
        svc.stop()
    with ar_helper.client(owner="autoresearch") as helper:
        assert [s["sandbox_id"] for s in helper.list_sandboxes()] == ledger["sandboxes"]
    refused = ServiceProcess(config_path)
    assert wait_exit(refused) != 0 and "--check-clean" in refused.output()
    result = check_clean(config_path)
    assert result.returncode == 0, result.stderr
    assert "released" in result.stdout
    with ar_helper.client(owner="autoresearch") as helper:
        assert helper.list_sandboxes() == []


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


TOOLS = ["shell", "background", "jobs", "log", "submit"]


async def mcp_noop(url: str, task_id: str) -> tuple[dict, object]:
    """Submitting nothing over MCP, by the mcp SDK's client at /mcp and by
    the stock openenv package's MCPToolClient (its MCP messages on /ws): 0."""
    from tests.support.token_clients import mcp_client as McpClient
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient
    from tests.support.token_clients import with_token
    async with McpClient(f"{url}/mcp?task_id={task_id}", read_timeout_seconds=300) as client:
        assert [t.name for t in (await client.list_tools()).tools] == TOOLS
        sdk = (await client.call_tool("submit", {})).structured_content
    async with with_token(MCPToolClient)(base_url=url, message_timeout_s=300) as env:
        await env.reset(task_id=task_id)
        assert [t.name for t in await env.list_tools()] == TOOLS
        stock = await env.step(CallToolAction(tool_name="submit", arguments={}))
    return sdk, stock


def test_stock_openenv_client_runs_an_episode(config_path, roots):
    """The stock OpenEnv client's episode to the reference's reward, then a
    no-op (submit at once) to 0 over MCP."""
    from openenv.core import GenericEnvClient
    from tests.support.token_clients import with_token
    assert check_clean(config_path).returncode == 0
    svc = ServiceProcess(config_path).wait_ready(120)
    try:
        with with_token(GenericEnvClient)(base_url=svc.url, message_timeout_s=300).sync() as env:
            result = env.reset(task_id="breast-cancer")
            assert result.done is False and "/task" in result.observation["output"]
            solve = reference(roots, "breast-cancer")
            result = env.step({"operation": "shell", "command":
                               f"cat > solve.py <<'EOF'\n{solve}\nEOF\npython solve.py && echo ok"})
            assert result.observation["exit_code"] == 0, result.observation
            result = env.step({"operation": "submit"})
            assert result.done is True and result.reward >= 0.9
        noop, stock = asyncio.run(mcp_noop(svc.url, "breast-cancer"))
        assert noop["done"] is True and noop["reward"] == 0.0 and noop["failure_class"] is None
        assert stock.done is True and stock.reward == 0.0
        assert stock.observation.result["failure_class"] is None
    finally:
        assert svc.stop() == 0, svc.output()[-3000:]
    *_, played, nothing, stock_nothing = [r for r in svc.outcomes()
                                          if r["task_id"] == "breast-cancer"]
    assert played["reward"] >= 0.9
    assert (nothing["episode_id"], nothing["reward"]) == (noop["episode_id"], 0.0)
    assert stock_nothing["reward"] == 0.0
