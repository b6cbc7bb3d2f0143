"""MCP on a served environment (camg.web.mcp_server): the ``mcp`` SDK's own
client over streamable HTTP ``/mcp``, and openenv-core's own MCPToolClient
over ``/ws`` and over its HTTP ``/mcp`` session methods, each list /schema's
tools and play whole episodes through the episode manager; then the edges
(session end, capacity, infrastructure failures, bad input), and Shop's
oracle over MCP on a real Shop service."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
import websockets
from mcp.shared.exceptions import MCPError
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient as StockMCPToolClient

from camg_client import Client
from tests.support.services import counter_tasks
from tests.support.token_clients import mcp_client as McpClient, with_token
from devtools.harness.auth import deployment_auth, headers as auth_headers

# counter_tasks(): task-04's number is 7 (the oracle's guess)
# the stock openenv-core client, with the session's token (it takes no headers)
MCPToolClient = with_token(StockMCPToolClient)
ORACLE_TASK, ORACLE_GUESS = "task-04", 7


def schema_tools(url: str) -> list[dict]:
    return [{"name": t["function"]["name"], "description": t["function"]["description"],
             "inputSchema": t["function"]["parameters"]} for t in Client(url).schema()["tools"]]


def sdk_tools(result) -> list[dict]:
    return [{"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in result.tools]


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


async def refused(url: str) -> MCPError:
    """The MCPError an SDK client's connect ends with (inside anyio's group)."""
    try:
        async with McpClient(url):
            pass
    except BaseException as exc:  # noqa: BLE001 - unwrapped and checked below
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, MCPError):
            return exc
        raise
    raise AssertionError(f"{url} was not refused")


def post(url: str, body, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json",
                                              "accept": "application/json, text/event-stream",
                                              **auth_headers(), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_sdk_client_lists_the_tools_and_plays_oracle_and_noop_episodes(counter_service):
    svc = counter_service()

    async def play() -> tuple[dict, dict, str, dict]:
        async with McpClient(f"{svc.url}/mcp?task_id={ORACLE_TASK}") as client:
            assert client.protocol_version == "2025-11-25"  # the handshake era: a session
            tools = sdk_tools(await client.list_tools())
            assert tools == schema_tools(svc.url)
            assert [t["name"] for t in tools] == ["guess", "sleep", "crash", "boom", "finish"]
            episode = client.session.initialize_result.meta["camg/episode"]
            assert episode["task_id"] == ORACLE_TASK and episode["done"] is False
            assert "Guess the number" in client.instructions
            hint = await client.call_tool("guess", {"value": 0})
            assert hint.is_error is False and hint.structured_content["observation"]["text"] == "higher"
            assert hint.structured_content["reward"] == 0.0 and hint.structured_content["done"] is False
            assert json.loads(hint.content[0].text) == hint.structured_content
            oracle = (await client.call_tool("guess", {"value": ORACLE_GUESS})).structured_content
            # after the end: the sticky terminal, as OpenEnv
            again = (await client.call_tool("guess", {"value": 1})).structured_content
        async with McpClient(f"{svc.url}/mcp?seed=3") as client:
            noop = (await client.call_tool("finish", {})).structured_content
            noop_task = client.session.initialize_result.meta["camg/episode"]["task_id"]
        return oracle, again, noop_task, noop

    oracle, again, noop_task, noop = asyncio.run(play())
    assert oracle["done"] is True and oracle["reward"] == 1.0 and oracle["failure_class"] is None
    assert again["reward"] == 1.0 and again["step"] == oracle["step"]
    assert noop["done"] is True and noop["reward"] == 0.0 and noop["failure_class"] is None
    assert noop_task == counter_tasks()[3 % 5]["task_id"]  # seed picks as POST /episodes
    records = svc.outcomes()
    assert [(r["task_id"], r["reward"], r["status"]) for r in records] == [
        (ORACLE_TASK, 1.0, "done"), (noop_task, 0.0, "done")]
    assert records[0]["episode_id"] == oracle["episode_id"]


def test_openenv_mcp_client_plays_over_ws_and_over_http_sessions(counter_service):
    svc = counter_service()
    expected = schema_tools(svc.url)

    async def over_ws():
        async with MCPToolClient(base_url=svc.url) as env:
            await env.reset(task_id=ORACLE_TASK)
            tools = await env.list_tools()
            assert [{"name": t.name, "description": t.description,
                     "inputSchema": t.input_schema} for t in tools] == expected
            body = await env.call_tool("guess", value=50)
            assert body["observation"]["text"] == "lower" and body["done"] is False
            result = await env.step(CallToolAction(tool_name="guess",
                                                   arguments={"value": ORACLE_GUESS}))
            assert result.done is True and result.reward == 1.0
            assert result.observation.result["failure_class"] is None
            await env.reset(task_id=ORACLE_TASK)
            noop = await env.step(CallToolAction(tool_name="finish", arguments={}))
            assert noop.done is True and noop.reward == 0.0

    async def over_http():
        env = MCPToolClient(base_url=svc.url)
        env.use_production_mode = True  # HTTP /mcp with openenv/session/*
        try:
            tools = await env.list_tools()
            assert [{"name": t.name, "description": t.description,
                     "inputSchema": t.input_schema} for t in tools] == expected
            # the session's episode is the next task in manifest order
            task = Client(svc.url).list()["episodes"][0]["task_id"]
            target = {t["task_id"]: t["data"]["target"] for t in counter_tasks()}[task]
            body = await env.call_tool("guess", value=target)
            assert body["done"] is True and body["reward"] == 1.0 and body["failure_class"] is None
        finally:
            await env.close()

    asyncio.run(over_ws())
    asyncio.run(over_http())
    records = svc.outcomes()
    assert [(r["reward"], r["status"]) for r in records] == [(1.0, "done"), (0.0, "done"),
                                                            (1.0, "done")]


def test_openenv_mcp_messages_on_ws(counter_service):
    svc = counter_service()

    async def scenario():
        async with websockets.connect(svc.url.replace("http", "ws") + "/ws",
                                      additional_headers=auth_headers()) as ws:
            async def rpc(data):
                await ws.send(json.dumps({"type": "mcp", "data": data}))
                reply = json.loads(await ws.recv())
                assert reply["type"] == "mcp", reply
                return reply["data"]
            listed = await rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert listed["result"]["tools"] == schema_tools(svc.url)
            early = await rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                               "params": {"name": "guess", "arguments": {"value": 1}}})
            assert early["error"]["data"]["error"] == "episode_not_found"
            created = await rpc({"jsonrpc": "2.0", "id": 3, "method": "openenv/session/create",
                                 "params": {"task_id": ORACLE_TASK}})
            session_id = created["result"]["session_id"]
            unknown = await rpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                 "params": {"name": "fly", "arguments": {}}})
            assert unknown["error"]["code"] == -32602
            assert unknown["error"]["data"]["error"] == "invalid_action"
            bad = await rpc({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                             "params": {"name": "guess", "arguments": {"value": "seven"}}})
            assert bad["error"]["code"] == -32602 and bad["error"]["data"]["error"] == "invalid_action"
            assert (await rpc({"jsonrpc": "2.0", "id": 6, "method": "nope"}))["error"]["code"] == -32601
            assert (await rpc({"id": 7, "method": "tools/list"}))["error"]["code"] == -32600
            done = await rpc({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                              "params": {"name": "guess", "arguments": {"value": ORACLE_GUESS}}})
            assert done["id"] == 8 and done["result"]["reward"] == 1.0
            assert done["result"]["episode_id"] == session_id
            # OpenEnv's CallToolAction as a step's data (what MCPToolClient sends)
            await ws.send(json.dumps({"type": "step", "data": {"type": "call_tool"}}))
            reply = json.loads(await ws.recv())["data"]["observation"]
            assert reply["error"]["error_type"] == "tool_not_found"
            # an action of the environment stays a step (the sticky terminal now)
            await ws.send(json.dumps({"type": "step", "data": {"operation": "finish"}}))
            assert json.loads(await ws.recv())["data"]["reward"] == 1.0
            await ws.send(json.dumps({"type": "mcp"}))
            assert json.loads(await ws.recv())["data"]["code"] == "VALIDATION_ERROR"
    asyncio.run(scenario())


def test_session_end_closes_the_episode_and_frees_capacity(counter_service):
    svc = counter_service(capacity=1)
    client = Client(svc.url)

    async def scenario():
        async with McpClient(f"{svc.url}/mcp?task_id={ORACLE_TASK}") as first:
            await first.call_tool("guess", {"value": 1})
            assert client.health()["episodes"]["active"] == 1
            # at capacity: the next session's initialize is refused, typed
            full = await refused(f"{svc.url}/mcp")
            assert full.error.data["error"] == "at_capacity"
        # the client's exit (DELETE) closed the episode: the slot is free
        async with McpClient(f"{svc.url}/mcp?task_id={ORACLE_TASK}") as second:
            assert (await second.call_tool("guess", {"value": ORACLE_GUESS})).structured_content["reward"] == 1.0

    asyncio.run(scenario())
    assert client.health()["episodes"]["active"] == 0
    records = svc.outcomes()
    assert [(r["status"], r["reward"], r["steps"]) for r in records] == [
        ("closed", None, 1), ("done", 1.0, 1)]
    assert records[0]["reason"] == "MCP session deleted"

    # openenv's HTTP session: close ends the episode; a dropped /ws too
    status, created = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 1,
                                              "method": "openenv/session/create",
                                              "params": {"task_id": ORACLE_TASK}})
    assert status == 200 and client.health()["episodes"]["active"] == 1
    session_id = created["result"]["session_id"]
    assert session_id != created["result"]["episode_id"]  # not guessable from /episodes
    status, closed = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 2,
                                             "method": "openenv/session/close",
                                             "params": {"session_id": session_id}})
    assert closed["result"] == {"session_id": session_id, "closed": True}
    assert client.health()["episodes"]["active"] == 0
    _, again = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                       "params": {"session_id": session_id, "name": "finish"}})
    assert again["error"]["data"]["error"] == "bad_request"

    async def dropped():
        async with MCPToolClient(base_url=svc.url) as env:
            await env.reset(task_id=ORACLE_TASK)
            await env.call_tool("guess", value=1)
    asyncio.run(dropped())
    wait_for(lambda: client.health()["episodes"]["active"] == 0)
    assert svc.outcomes()[-1]["status"] == "closed"


def test_an_abandoned_session_ends_with_its_lease(counter_service):
    """A client gone without DELETE: the episode's lease (the SDK session's
    idle timeout too) ends it, masked as a timeout."""
    svc = counter_service(limits={"idle_ttl_s": 1})

    async def scenario():
        async with McpClient(f"{svc.url}/mcp?task_id={ORACLE_TASK}",
                             terminate_on_close=False) as client:
            await client.call_tool("guess", {"value": 1})
    asyncio.run(scenario())
    [record] = wait_for(svc.outcomes, 15)
    assert (record["status"], record["reward"], record["failure_class"], record["reason"]) == (
        "closed", None, "timeout", "lease expired")
    assert Client(svc.url).health()["episodes"]["active"] == 0


def test_infrastructure_failures_are_reward_null_with_a_failure_class(counter_service):
    tasks = counter_tasks() + [{"task_id": "broken", "data": {"target": 1, "reset_fails": True}},
                               {"task_id": "ungradable", "data": {"target": 1, "grade_fails": True}}]
    svc = counter_service(tasks=tasks)

    async def scenario():
        async with McpClient(f"{svc.url}/mcp?task_id={ORACLE_TASK}") as client:
            crashed = await client.call_tool("crash", {})
            assert crashed.is_error is False  # an outcome, not a bad call
            body = crashed.structured_content
            assert body["done"] is True and body["reward"] is None
            assert body["failure_class"] == "sandbox_died"
        async with McpClient(f"{svc.url}/mcp?task_id=ungradable") as client:
            body = (await client.call_tool("finish", {})).structured_content
            assert body["reward"] is None and body["failure_class"] == "grader_error"
        # a reset that fails: the initialize's error, masked with its class
        failed = await refused(f"{svc.url}/mcp?task_id=broken")
        assert failed.error.data["failure_class"] == "sandbox_died"
        async with MCPToolClient(base_url=svc.url) as env:
            await env.reset(task_id=ORACLE_TASK)
            result = await env.step(CallToolAction(tool_name="boom", arguments={}))
            assert result.done is True and result.reward is None
            assert result.observation.result["failure_class"] == "infra"

    asyncio.run(scenario())
    records = {r["task_id"]: r for r in svc.outcomes()}
    assert records["broken"]["reward"] is None and records["broken"]["failure_class"] == "sandbox_died"
    assert records["ungradable"]["failure_class"] == "grader_error"


def test_bad_tool_calls_and_bad_requests_are_typed_errors(counter_service):
    svc = counter_service()
    url = f"{svc.url}/mcp"

    async def scenario():
        async with McpClient(f"{url}?task_id={ORACLE_TASK}") as client:
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("fly", {})
            assert unknown.value.error.code == -32602
            assert unknown.value.error.data["error"] == "invalid_action"
            for name, arguments in [("guess", {"value": "seven"}), ("guess", {"bogus": 1}),
                                    ("guess", {"operation": "finish"})]:
                bad = await client.call_tool(name, arguments)
                assert bad.is_error is True, (name, arguments)
                assert bad.structured_content["error"] == "invalid_action"
            # none of those was a step
            good = await client.call_tool("guess", {"value": ORACLE_GUESS})
            assert good.structured_content["step"] == 1 and good.structured_content["reward"] == 1.0
        for query, error in [("task_id=nope", "task_not_found"), ("seed=x", "bad_request"),
                             ("bogus=1", "bad_request"), ("seed=1&seed=2", "bad_request")]:
            assert (await refused(f"{url}?{query}")).error.data["error"] == error, query

        async with MCPToolClient(base_url=svc.url) as env:
            await env.reset(task_id=ORACLE_TASK)
            with pytest.raises(RuntimeError, match="tool_not_found"):
                await env.call_tool("fly")
            with pytest.raises(RuntimeError, match="invalid_args"):
                await env.call_tool("guess", value="seven")
            assert (await env.call_tool("guess", value=ORACLE_GUESS))["step"] == 1

    asyncio.run(scenario())
    # the stateless 2026-07-28 era has no session for an episode: refused,
    # naming the handshake versions (the SDK's auto mode falls back to them)
    status, body = post(url, {"jsonrpc": "2.0", "id": 1, "method": "server/discover"},
                        {"mcp-protocol-version": "2026-07-28"})
    assert status == 400 and body["error"]["code"] == -32022
    assert "2025-11-25" in body["error"]["data"]["supported"]
    status, body = post(url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "finish"}}, {"mcp-protocol-version": "2026-07-28"})
    assert status == 400 and body["error"]["code"] == -32022
    request = urllib.request.Request(url, data=b"{nope", method="POST",
                                     headers={"content-type": "application/json",
                                              **auth_headers()})
    with pytest.raises(urllib.error.HTTPError) as parse:
        urllib.request.urlopen(request, timeout=10)
    assert parse.value.code == 400 and json.loads(parse.value.read())["error"]["code"] == -32700
    status, body = post(url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"session_id": "forged", "name": "finish"}})
    assert body["error"]["data"]["error"] == "bad_request"
    status, body = post(url, {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                              "params": {"task_id": ORACLE_TASK, "bogus": 1}})
    assert body["error"]["code"] == -32602 and body["error"]["data"]["error"] == "bad_request"
    # no standalone event stream (it would hold a graceful stop open)
    with pytest.raises(urllib.error.HTTPError) as stream:
        urllib.request.urlopen(urllib.request.Request(
            url, headers={"accept": "text/event-stream", **auth_headers()}), timeout=10)
    assert stream.value.code == 405
    # a foreign Host (DNS rebinding) is refused before any session
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"content-type": "application/json",
                                              "host": "evil.example:80", **auth_headers()})
    with pytest.raises(urllib.error.HTTPError) as foreign:
        urllib.request.urlopen(request, timeout=10)
    assert foreign.value.code in (400, 403, 421)
    assert Client(svc.url).health()["episodes"]["active"] == 0
    assert svc.outcomes() == [] or all(r["status"] != "running" for r in svc.outcomes())


@pytest.fixture(scope="module")
def shop_service(tmp_path_factory):
    from tests.support import shop_testing
    from tests.support.services import ServiceProcess
    service = ServiceProcess(shop_testing.configure_service(tmp_path_factory.mktemp("shop-mcp")))
    try:
        yield service.wait_ready(timeout=240)
    finally:
        service.stop()


def test_shop_oracle_and_noop_over_mcp(shop_service):
    from environments.shop.store import ProductStore
    from tests.support import shop_testing
    manifest = json.loads((shop_testing.prepared()[0] / "manifest.json").read_text())
    task = manifest["tasks"][7]
    goal = task["data"]["goal"]
    products = ProductStore(shop_testing.prepared()[1]["product_pool"])
    title = products[goal["asin"]]["Title"].replace("[", " ").replace("]", " ")
    url = shop_service.url

    async def buy(act) -> dict:
        """The oracle's clicks through ``act(tool, arguments)``: the goal's
        product, its options, buy now."""
        def click(text: str):
            return act("click", {"text": text})
        step = await act("search", {"query": title})
        while goal["asin"].lower() not in step["observation"]["available_actions"]["clickables"]:
            step = await click("next >")
        await click(goal["asin"].lower())
        for value in goal["goal_options"].values():
            await click(value)
        return await click("buy now")

    async def play():
        async with McpClient(f"{url}/mcp?task_id={task['task_id']}") as client:
            listed = sdk_tools(await client.list_tools())
            assert listed == schema_tools(url) and [t["name"] for t in listed] == ["search", "click"]

            async def act(tool: str, arguments: dict) -> dict:
                result = await client.call_tool(tool, arguments)
                assert result.is_error is False, result.structured_content
                return result.structured_content
            oracle = await buy(act)
        # the stock openenv package's MCP client, over /ws
        async with MCPToolClient(base_url=url) as env:
            await env.reset(task_id=task["task_id"])
            assert [t.name for t in await env.list_tools()] == ["search", "click"]

            async def act(tool: str, arguments: dict) -> dict:
                return await env.call_tool(tool, **arguments)
            stock = await buy(act)
        async with McpClient(f"{url}/mcp?task_id={task['task_id']}") as client:
            # searching until the step limit buys nothing: 0
            for _ in range(500):
                noop = (await client.call_tool("search", {"query": "nothing"})).structured_content
                if noop["done"]:
                    break
        async with MCPToolClient(base_url=url) as env:
            await env.reset(task_id=task["task_id"])
            for _ in range(500):
                stock_noop = await env.call_tool("search", query="nothing")
                if stock_noop["done"]:
                    break
        assert stock_noop["reward"] == 0.0 and stock_noop["failure_class"] is None, stock_noop
        return oracle, noop, stock

    oracle, noop, stock = asyncio.run(play())
    assert oracle["done"] is True and oracle["reward"] == 1.0 and oracle["failure_class"] is None
    assert stock["done"] is True and stock["reward"] == 1.0 and stock["failure_class"] is None
    assert noop["done"] is True and noop["reward"] == 0.0 and noop["failure_class"] is None
    rewards = {r["episode_id"]: r["reward"] for r in shop_service.outcomes()}
    assert rewards[oracle["episode_id"]] == 1.0 and rewards[noop["episode_id"]] == 0.0
    assert rewards[stock["episode_id"]] == 1.0


def configure_tooly(tmp):
    """A service of tests/support/tool_env.py (General's tool shape)."""
    import sys

    from camg.config import task_manifest as manifest
    from camg.configure import configure
    from tests.support.services import clean_git_tree, free_port
    tmp.mkdir(parents=True)
    (tmp / "requirements.lock").write_text("falcon==4.4.0\n")
    manifest.write(tmp / "manifest.json", manifest.build(
        "tooly", [{"task_id": "t-1", "data": {"ids": {"ada": 42, "bob": 7}}}],
        created_by="tests", sampling={"mode": "sequential", "seed": 0}, files={}))
    (tmp / "deployment.json").write_text(json.dumps({
        "auth": deployment_auth(),
        "runtime_lock": str(tmp / "requirements.lock"), "state_root": str(tmp / "state"),
        "helper_socket": str(tmp / "helper.sock"), "executables": {"python": sys.executable},
        "environments": {"tooly": {"manifest": "manifest.json", "port": free_port(),
                                   "capacity": 2,
                                   "factory": "tests.support.tool_env:ToolEnvironment"}}}))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "tooly.json"


def test_a_tasks_own_tools_are_passed_through(tmp_path):
    from tests.support.services import ServiceProcess
    from tests.support.tool_env import TOOLS
    svc = ServiceProcess(configure_tooly(tmp_path / "tooly")).wait_ready()
    lookup = {"name": "crm__lookup", "inputSchema": TOOLS[0]["input_schema"]}
    try:
        async def scenario():
            async with McpClient(f"{svc.url}/mcp") as client:
                listed = sdk_tools(await client.list_tools())
                assert listed[:2] == schema_tools(svc.url)  # the actions first
                assert [(t["name"], t["inputSchema"]) for t in listed[2:]] == [
                    (lookup["name"], lookup["inputSchema"])]
                found = (await client.call_tool("crm__lookup", {"customer": "ada"}))
                assert found.structured_content["observation"]["text"] == "id 42"
                # the action itself still reaches any tool of the task
                other = await client.call_tool("tool", {"server": "crm", "name": "two words"})
                assert other.structured_content["observation"]["text"] == "no tool crm.two words"
                done = await client.call_tool("finish", {"answer": "42"})
                assert done.structured_content["reward"] == 1.0
            async with MCPToolClient(base_url=svc.url) as env:
                await env.reset()
                names = [t.name for t in await env.list_tools()]
                assert names == ["tool", "finish", "crm__lookup"]
                assert (await env.call_tool("crm__lookup", customer="bob"))["observation"][
                    "text"] == "id 7"
                result = await env.step(CallToolAction(tool_name="finish",
                                                       arguments={"answer": "7"}))
                assert result.done is True and result.reward == 0.0
            # without a session, the actions only (no task yet)
            _, body = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                                              "params": {"session_id": "none"}})
            assert [t["name"] for t in body["result"]["tools"]] == ["tool", "finish"]
            _, created = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 2,
                                                 "method": "openenv/session/create"})
            session = {"session_id": created["result"]["session_id"]}
            _, body = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                                              "params": session})
            assert body["result"]["tools"][-1]["name"] == "crm__lookup"
            _, bad = post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                             "params": {**session, "name": "crm__lookup",
                                                        "arguments": ["ada"]}})
            assert bad["error"]["data"]["error"] == "invalid_action"
            post(f"{svc.url}/mcp", {"jsonrpc": "2.0", "id": 5, "method": "openenv/session/close",
                                    "params": session})
        asyncio.run(scenario())
        assert [r["reward"] for r in svc.outcomes()] == [1.0, 0.0, None]
    finally:
        svc.stop()
