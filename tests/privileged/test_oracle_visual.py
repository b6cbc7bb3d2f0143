"""The operator's end-to-end check on Visual: ``python -m camg_client
--policy oracle`` against a real service (references enabled, the demo tasks
prepared with ``--references``: the reference sites) earns the maximum on
every task it runs, ``--policy noop`` (finish at once: an empty dist/) the
minimum, 0, and so does a no-op over MCP (the mcp SDK's client at /mcp and
the stock openenv package's MCPToolClient on /ws).

What "maximum" means for a judged environment: the reward is the judge's
rubric score, and no site is owed 1.0 by a real vision judge — the rubric
even caps premium_assets at 0.6 for sites without real visual assets. The
maximum is the best score the judge in use can give. The scripted judge of
the tests (tools/judge_stub.py, by pixel statistics) can give at most
(1 + 1 + 0.6) / 3 = 0.8667 (``MAX_SCORE``), and scores blank or error pages
0 as the rubric says; the oracle must reach that maximum, i.e. the reference
site arrives in dist/ intact, is rendered whole (the mirrored Tailwind build
included) and judged. Kept cheap: two tasks, one with Tailwind, one without.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from camg.configure import configure
from tests.privileged.container_fixtures import image_ref, needs_docker  # noqa: F401 (fixture)
from tests.support.services import ServiceProcess, clean_git_tree, free_port
from test_oracle_autoresearch import run_rollout
from test_visual_episodes import (OWNER, assert_nothing_left, judge, judge_env,  # noqa: F401
                                  mirror_manifest, renderer_dir, visual_helper)
from tools.judge_stub import MAX_SCORE
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow, pytest.mark.docker, needs_docker]

TASKS = ["camg_webdev_demo_002", "camg_webdev_demo_003"]   # Tailwind (dark), plain CSS


@pytest.fixture(scope="module")
def oracle_config(tmp_path_factory, image_ref, renderer_dir, mirror_manifest,  # noqa: F811
                  visual_helper):  # noqa: F811
    from environments.visual.prepare import prepare_visual
    from environments.visual.demo import demo_tasks

    tmp = tmp_path_factory.mktemp("visual-oracle")
    rows = demo_tasks.build(tmp / "demo")
    prepare_visual(rows_path=rows, renderer=renderer_dir, cdn_mirror=mirror_manifest,
                   output=tmp / "visual-manifest.json", image=image_ref,
                   references=tmp / "demo" / "reference")
    (tmp / "requirements.lock").write_text("falcon==4.4.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(tmp / "requirements.lock"), "state_root": str(tmp / "state"),
        "helper_socket": visual_helper.socket, "executables": {"python": sys.executable},
        "environments": {"visual": {
            "manifest": "visual-manifest.json", "port": free_port(), "capacity": 4,
            "references": True, "limits": {"action_timeout_s": 600, "grade_timeout_s": 120},
            "settings": {"memory_bytes": 256 << 20, "cpu": 0.5, "pids_max": 256, "pool_size": 0,
                         "render_timeout": 240, "render_memory_bytes": 1 << 30,
                         "judge_backoff_s": 0.0, "judge_attempts": 2, "helper_owner": OWNER}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp


async def mcp_noop(url: str, task_id: str) -> tuple[dict, object]:
    """Finishing at once over MCP, by the mcp SDK's client at /mcp and by
    the stock openenv package's MCPToolClient (its MCP messages on /ws): 0."""
    from tests.support.token_clients import mcp_client as McpClient
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient
    from tests.support.token_clients import with_token
    async with McpClient(f"{url}/mcp?task_id={task_id}", read_timeout_seconds=600) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["shell", "finish"]
        sdk = (await client.call_tool("finish", {})).structured_content
    async with with_token(MCPToolClient)(base_url=url, message_timeout_s=600) as env:
        await env.reset(task_id=task_id)
        assert [t.name for t in await env.list_tools()] == ["shell", "finish"]
        stock = await env.step(CallToolAction(tool_name="finish", arguments={}))
    return sdk, stock


def test_oracle_earns_the_judges_maximum_and_noop_zero(oracle_config, judge,  # noqa: F811
                                                       visual_helper, tmp_path):  # noqa: F811
    body = json.loads((oracle_config / "visual-manifest.json").read_text())
    assert all("index.html" in t["data"]["reference"]["files"] for t in body["tasks"])
    svc = ServiceProcess(oracle_config / "prepared" / "visual.json",
                         env=judge_env(judge)).wait_ready(120)
    try:
        routes = oracle_config / "prepared" / "routes.json"
        status, lines = run_rollout(routes, "visual", "oracle", TASKS, tmp_path)
        assert status == 0, lines
        assert sorted((l["task_id"], l["reward"], l["failure_class"]) for l in lines) == \
            [(t, MAX_SCORE, None) for t in TASKS], lines
        status, lines = run_rollout(routes, "visual", "noop", TASKS, tmp_path)
        assert status == 0, lines
        assert sorted((l["task_id"], l["reward"], l["failure_class"]) for l in lines) == \
            [(t, 0.0, None) for t in TASKS], lines
        noop, stock = asyncio.run(mcp_noop(svc.url, TASKS[1]))
        assert noop["done"] is True and noop["reward"] == 0.0 and noop["failure_class"] is None
        assert stock.done is True and stock.reward == 0.0
        assert stock.observation.result["failure_class"] is None
    finally:
        svc.stop()
    assert_nothing_left(visual_helper, svc)
