"""Coding over MCP: a real ``camg.serve`` Coding service (helper sandboxes on
the demo image) driven by the ``mcp`` SDK's own streamable HTTP client at
``/mcp``: the gold fix to 1.0, a no-op finish to 0.0, and both again by the
stock openenv package's MCPToolClient (/ws), each session one episode with
its outcome record (coding_fixtures.py's helper and task set).
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from tests.support.token_clients import mcp_client as McpClient
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient
from tests.support.token_clients import with_token

import conftest as pc
from camg.config import task_manifest as manifest
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CACHE = pc.CACHE / "coding"


@pytest.fixture(scope="module")
def service(demo_set, demo_image, coding_helper, tmp_path_factory):
    from camg.configure import configure
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    from tests.support.services import ServiceProcess, clean_git_tree, free_port
    work = tmp_path_factory.mktemp("coding-mcp")
    images = work / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=work / "manifest.json",
                   layers_root=CACHE / "layers")
    (work / "requirements.lock").write_text("swebench==4.1.0\n")
    (work / "deployment.json").write_text(json.dumps({
        "auth": deployment_auth(),
        "runtime_lock": str(work / "requirements.lock"), "state_root": str(work / "state"),
        "helper_socket": coding_helper.socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(work / "manifest.json"), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(demo_set / "mirrors"), "images": str(images),
                         "layers_root": str(CACHE / "layers")}}}}))
    configure(work / "deployment.json", work / "prepared", source_tree=clean_git_tree(work / "src"))
    proc = ServiceProcess(work / "prepared" / "coding.json")
    try:
        proc.wait_ready(timeout=120)
        yield proc, manifest.load(work / "manifest.json")
    finally:
        assert proc.stop() == 0, proc.output()[-3000:]


def test_gold_fix_to_one_and_noop_to_zero_over_mcp(service):
    proc, loaded = service
    task = loaded.tasks[1]
    url = f"{proc.url}/mcp?task_id={task.task_id}"

    async def play():
        async with McpClient(url, read_timeout_seconds=600) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["shell", "finish"]
            first = client.session.initialize_result.meta["camg/episode"]
            assert task.data["problem_statement"] in first["observation"]["output"]
            fix = await client.call_tool("shell", {
                "command": f"git apply -R - <<'CAMG_EOF'\n{task.data['patch']}\nCAMG_EOF"})
            assert fix.is_error is False and fix.structured_content["observation"]["exit_code"] == 0
            assert fix.structured_content["done"] is False
            bad = await client.call_tool("shell", {"command": 3})
            assert bad.is_error is True and bad.structured_content["error"] == "invalid_action"
            gold = (await client.call_tool("finish", {})).structured_content
        async with McpClient(url, read_timeout_seconds=600) as client:
            noop = (await client.call_tool("finish", {})).structured_content
        # the stock openenv package's MCP client (its MCP messages on /ws)
        async with with_token(MCPToolClient)(base_url=proc.url, message_timeout_s=600) as env:
            await env.reset(task_id=task.task_id)
            assert [t.name for t in await env.list_tools()] == ["shell", "finish"]
            fix = await env.call_tool("shell", command=f"git apply -R - <<'CAMG_EOF'\n"
                                                       f"{task.data['patch']}\nCAMG_EOF")
            assert fix["observation"]["exit_code"] == 0 and fix["done"] is False, fix
            stock = await env.step(CallToolAction(tool_name="finish", arguments={}))
            await env.reset(task_id=task.task_id)
            stock_noop = await env.step(CallToolAction(tool_name="finish", arguments={}))
            assert stock_noop.done is True and stock_noop.reward == 0.0
        return gold, noop, stock

    gold, noop, stock = asyncio.run(play())
    assert gold["done"] is True and gold["reward"] == 1.0 and gold["failure_class"] is None, gold
    assert noop["done"] is True and noop["reward"] == 0.0 and noop["failure_class"] is None, noop
    assert stock.done is True and stock.reward == 1.0
    assert stock.observation.result["failure_class"] is None
    records = proc.outcomes()
    assert [(r["episode_id"], r["reward"], r["integrity"]) for r in records[:2]] == [
        (gold["episode_id"], 1.0, "ok"), (noop["episode_id"], 0.0, "ok")]
    assert [(r["reward"], r["integrity"]) for r in records[2:]] == [(1.0, "ok"), (0.0, "ok")]
