"""GET /tasks: paging, manifest order and the selection hash, on real
services built in process from a configured deployment (Shop and General
rows carry kind and split; the framework's counter rows carry neither),
and the trainer client's pages over a real camg.serve process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from falcon import testing

from camg import serve
from camg.config import service_config as cfg, task_manifest as manifest
from camg.web import action_tools
from camg.web.app import create_app
from camg.configure import configure
from camg_client import Client
from tests.support.services import (COUNTER_FACTORY, clean_git_tree, counter_tasks,
                                    free_port)
from devtools.harness.auth import deployment_auth, headers as auth_headers

SHA = "sha256:" + "0" * 64


def in_process(tmp: Path, environment: str, tasks: list[dict], *, factory: str | None = None,
               settings: dict | None = None) -> InProcess:
    """The service camg.serve would run for this manifest, its app driven in
    this process (no lifespan: the environment is built, not started, which
    is all a listing reads)."""
    tmp.mkdir(parents=True)
    (tmp / "requirements.lock").write_text("falcon==4.4.0\n")
    manifest.write(tmp / "manifest.json", manifest.build(
        environment, tasks, sampling={"order": "rows"}, files={}, created_by="tests"))
    entry = {"manifest": "manifest.json", "port": free_port(), "capacity": 2,
             "settings": settings or {}}
    if factory:
        entry["factory"] = factory
    (tmp / "deployment.json").write_text(json.dumps({
        "auth": deployment_auth(),
        "runtime_lock": "requirements.lock", "state_root": str(tmp / "state"),
        "helper_socket": str(tmp / "helper.sock"), "executables": {},
        "environments": {environment: entry}}))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    path = tmp / "prepared" / f"{environment}.json"
    config = cfg.load_service_config(path)
    return InProcess(create_app(serve.build_service(config, cfg.verify(config, path))))


class InProcess:
    """Requests to one app in this process, outside the lifespan (an
    ASGIConductor not entered as a context starts nothing; the TestClient
    would start the environment: Shop's JVM)."""

    def __init__(self, app) -> None:
        self.conductor = testing.ASGIConductor(app)

    def simulate_get(self, path: str, **kwargs):
        # the app is behind the token gate, as served
        kwargs["headers"] = {**auth_headers(), **(kwargs.get("headers") or {})}
        return asyncio.run(self.conductor.simulate_get(path, **kwargs))


def shop_tasks() -> list[dict]:
    # Unsorted ids, two splits and a row of a kind without one.
    rows = [{"task_id": f"webshop-human-{i:05d}",
             "data": {"kind": "webshop", "source": "human", "split": split, "goal_index": i,
                      "goal": {"asin": "B0"}}}
            for i, split in ((7, "test"), (3, "train"), (5, "eval"), (1, "train"))]
    rows.insert(2, {"task_id": "exact-00001", "data": {
        "kind": "exact_product", "instruction_text": "a mug", "target_asins": ["B0"],
        "target_options": {}}})
    return rows


def general_tasks(n: int) -> list[dict]:
    return [{"task_id": f"g-{n - i:03d}", "data": {
        "kind": ("opensource-code", "general_agent")[i % 2],
        "image": f"example.invalid/task@{SHA}", "instance_id": f"g-{i}"}} for i in range(n)]


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    return in_process(tmp_path_factory.mktemp("shop") / "d", "shop", shop_tasks(), settings={
        "java_home": "/nonexistent/java", "product_pool": "/nonexistent/pool.json",
        "product_pool_sha256": SHA, "index_dir": "/nonexistent/index", "index_sha256": SHA})


@pytest.fixture(scope="module")
def general(tmp_path_factory):
    return in_process(tmp_path_factory.mktemp("general") / "d", "general", general_tasks(25))


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    return in_process(tmp_path_factory.mktemp("counter") / "d", "counter", counter_tasks(5),
                      factory=COUNTER_FACTORY)


def get(client, query: str = "") -> tuple[int, dict]:
    result = client.simulate_get("/tasks", query_string=query)
    return result.status_code, result.json


def test_shop_lists_ids_in_manifest_order_with_kind_split_and_the_metadata_hash(shop):
    status, page = get(shop)
    assert status == 200
    assert page["tasks"] == [
        {"task_id": "webshop-human-00007", "kind": "webshop", "split": "test"},
        {"task_id": "webshop-human-00003", "kind": "webshop", "split": "train"},
        {"task_id": "exact-00001", "kind": "exact_product", "split": None},
        {"task_id": "webshop-human-00005", "kind": "webshop", "split": "eval"},
        {"task_id": "webshop-human-00001", "kind": "webshop", "split": "train"},
    ]
    assert (page["offset"], page["limit"], page["total"], page["next_offset"]) == (0, 100, 5, None)
    metadata = shop.simulate_get("/metadata").json
    assert page["task_selection_hash"] == metadata["task_selection_hash"]
    assert page["total"] == metadata["task_count"]


def test_pages_walk_the_whole_list_once_in_order(general):
    expected = [t["task_id"] for t in general_tasks(25)]
    seen, offset, pages = [], 0, 0
    while offset is not None:
        status, page = get(general, f"offset={offset}&limit=10")
        assert status == 200 and page["total"] == 25 and page["offset"] == offset
        seen += [t["task_id"] for t in page["tasks"]]
        offset, pages = page["next_offset"], pages + 1
    assert seen == expected and pages == 3
    assert get(general, "offset=0&limit=1")[1]["tasks"] == [
        {"task_id": "g-025", "kind": "opensource-code", "split": None}]
    assert get(general, "offset=1&limit=1")[1]["tasks"][0]["kind"] == "general_agent"


@pytest.mark.parametrize("query, ids, next_offset", [
    ("offset=0&limit=24", slice(0, 24), 24),
    ("offset=20&limit=5", slice(20, 25), None),     # the last page, exactly full
    ("offset=20&limit=1000", slice(20, 25), None),  # the largest limit
    ("offset=24", slice(24, 25), None),
    ("offset=25", slice(0, 0), None),               # offset == total: empty, the end
    ("offset=26&limit=3", slice(0, 0), None),       # past the end: the same
    ("offset=9223372036854775807", slice(0, 0), None),
    ("limit=1", slice(0, 1), 1),
])
def test_paging_edges(general, query, ids, next_offset):
    status, page = get(general, query)
    assert status == 200, page
    assert [t["task_id"] for t in page["tasks"]] == \
        [t["task_id"] for t in general_tasks(25)][ids]
    assert page["next_offset"] == next_offset and page["total"] == 25


@pytest.mark.parametrize("query, field", [
    ("limit=0", "limit"), ("limit=-1", "limit"), ("limit=1001", "limit"),
    ("limit=1.5", "limit"), ("limit=ten", "limit"), ("limit=", "limit"), ("limit=+5", "limit"),
    ("limit=1e3", "limit"), ("limit=99999999999999999999", "limit"),
    ("offset=-1", "offset"), ("offset=x", "offset"), ("offset=1&offset=2", "offset"),
    ("page=2", "page"),
])
def test_bad_paging_is_a_typed_400_naming_the_parameter(general, query, field):
    status, body = get(general, query)
    assert status == 400 and body["error"] == "bad_request"
    assert field in body["message"]


def test_rows_without_kind_or_split_list_null(counter):
    status, page = get(counter, "limit=2")
    assert status == 200
    assert page["tasks"] == [{"task_id": "task-04", "kind": None, "split": None},
                             {"task_id": "task-03", "kind": None, "split": None}]
    assert page["next_offset"] == 2


def test_schema_describes_the_route(shop):
    schema = shop.simulate_get("/schema").json
    assert schema["tasks_query"]["properties"]["limit"]["maximum"] == 1000
    assert set(schema["tasks_response"]["required"]) == {
        "tasks", "offset", "limit", "total", "next_offset", "task_selection_hash"}
    # the tools come from the very action schema served beside them
    assert schema["tools"] == action_tools.tools(schema["action"], name="shop")
    assert [t["function"]["name"] for t in schema["tools"]] == ["search", "click"]


def test_a_bad_task_fact_stops_the_service_at_build(tmp_path):
    from camg.environment import Task
    from camg.errors import ConfigError
    from camg.web.task_listing import TaskListing
    from devtools.harness.counter_env import CounterEnvironment

    class Odd(CounterEnvironment):
        def task_facts(self, task):
            return {"kind": 3, "split": None}

    env = Odd.__new__(Odd)
    env.tasks = [Task("t", {})]
    with pytest.raises(ConfigError, match="task_facts"):
        TaskListing(env, SHA)


def test_the_client_pages_over_a_real_service(shared_counter_service):
    client = Client(shared_counter_service.url)
    first = client.tasks(limit=2)
    assert [t["task_id"] for t in first["tasks"]] == ["task-04", "task-03"]
    assert first["next_offset"] == 2
    assert first["task_selection_hash"] == client.metadata()["task_selection_hash"]
    assert [t["task_id"] for t in client.iter_tasks(limit=2)] == \
        [t["task_id"] for t in counter_tasks(5)]
    assert client.tasks(offset=5)["tasks"] == []


def test_the_async_client_pages_too(shared_counter_service):
    from camg_client import AsyncClient

    async def scenario():
        async with AsyncClient(shared_counter_service.url) as client:
            page = await client.tasks(offset=4)
            return page, [t["task_id"] async for t in client.iter_tasks(limit=3)]

    page, ids = asyncio.run(scenario())
    assert page["tasks"] == [{"task_id": "task-00", "kind": None, "split": None}]
    assert ids == [t["task_id"] for t in counter_tasks(5)]
