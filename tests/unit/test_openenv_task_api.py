"""OpenEnv's Task API (camg/web/openenv_tasks.py) on real camg.serve processes
of the counter environment: its splits and tasks against GET /tasks, the
edges of a range, typed refusals, and the stock openenv 0.10.0 client
(openenv.harbor.client.HarborEnv) in its own scratch venv."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request

import jsonschema
import pytest

from camg.errors import ConfigError
from camg.web.openenv_tasks import TaskSplits
from tests.support.framework_venvs import framework_venv
from tests.support.services import REPO, ServiceProcess, configure_counter
from devtools.harness.auth import headers as auth_headers

LOOP = REPO / "tests" / "support" / "adapter_loops" / "openenv_task_api.py"
# Manifest order, not sorted; splits in the order they first appear, and a
# row without a split (it goes to the split named for the environment).
SPLIT_ROWS = [("c-5", "train"), ("c-1", "test"), ("c-4", "train"), ("c-0", None),
              ("c-3", "eval"), ("c-2", "train")]


@pytest.fixture(scope="module")
def split_service(tmp_path_factory):
    tasks = [{"task_id": tid, "data": {"target": 3, **({"split": split} if split else {})}}
             for tid, split in SPLIT_ROWS]
    service = ServiceProcess(configure_counter(tmp_path_factory.mktemp("oe") / "svc",
                                               tasks=tasks)).wait_ready()
    yield service
    service.stop(signal.SIGINT)


def call(url: str, path: str, body: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json",
                                              **auth_headers()})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def listing(url: str) -> list[dict]:
    status, page = call(url, "/tasks?limit=1000")
    assert status == 200
    return page["tasks"]


def by_split(url: str) -> dict[str, list[str]]:
    """GET /tasks's ids grouped as the Task API must group them."""
    groups: dict[str, list[str]] = {}
    for row in listing(url):
        groups.setdefault(row["split"] or "counter", []).append(row["task_id"])
    return groups


def test_splits_are_the_listings_in_first_appearance_order(split_service):
    assert call(split_service.url, "/list_environments") == (200, ["counter"])
    status, splits = call(split_service.url, "/counter/splits")
    assert status == 200
    assert splits == [{"name": "train", "type": "train", "num_tasks": 3},
                      {"name": "test", "type": "test", "num_tasks": 1},
                      {"name": "counter", "type": "validation", "num_tasks": 1},
                      {"name": "eval", "type": "validation", "num_tasks": 1}]
    assert {s["name"]: s["num_tasks"] for s in splits} == \
        {name: len(ids) for name, ids in by_split(split_service.url).items()}


def test_tasks_carry_index_id_split_and_kind_and_nothing_of_the_data(split_service):
    status, body = call(split_service.url, "/counter/tasks", {"split": "train"})
    assert status == 200
    assert body == {"env_name": "counter", "tasks": [
        {"index": i, "task_id": tid, "task_name": tid, "dataset": "train", "kind": None}
        for i, tid in enumerate(["c-5", "c-4", "c-2"])]}
    assert call(split_service.url, "/counter/num_tasks", {"split": "train"}) == \
        (200, {"num_tasks": 3})
    assert call(split_service.url, "/counter/task", {"split": "train", "index": 2}) == \
        (200, {"task": body["tasks"][2]})
    # "" is the first split, as Harbor's provider reads it
    assert call(split_service.url, "/counter/num_tasks", {"split": ""}) == \
        (200, {"num_tasks": 3})


@pytest.mark.parametrize("start, stop, ids", [
    (None, None, ["c-5", "c-4", "c-2"]),
    (1, 2, ["c-4"]),
    (1, None, ["c-4", "c-2"]),
    (None, 1, ["c-5"]),
    (2, 2, []),
    (2, 1, []),
    (2, 100, ["c-2"]),
    (3, 4, []),
    (50, 60, []),
])
def test_range_edges(split_service, start, stop, ids):
    body = {"split": "train", **({} if start is None else {"start": start}),
            **({} if stop is None else {"stop": stop})}
    status, reply = call(split_service.url, "/counter/task_range", body)
    assert status == 200
    assert [t["task_id"] for t in reply["tasks"]] == ids
    assert [t["index"] for t in reply["tasks"]] == \
        [["c-5", "c-4", "c-2"].index(tid) for tid in ids]


@pytest.mark.parametrize("path, body, status, words", [
    ("/counter/task_range", {"split": "train", "start": -1}, 400, "start must be 0 or more"),
    ("/counter/task_range", {"split": "train", "stop": -2}, 400, "stop must be 0 or more"),
    ("/counter/task_range", {"split": "validation"}, 400, "unknown split 'validation'"),
    ("/counter/task_range", {"split": "train", "start": "1"}, 400, "body.start"),
    ("/counter/task_range", {"start": 0}, 400, "body.split: required"),
    ("/counter/task_range", {"split": "train", "count": 2}, 400, "unknown field(s) count"),
    ("/counter/tasks", {"split": "TRAIN"}, 400, "unknown split 'TRAIN'"),
    ("/counter/num_tasks", {"split": None}, 400, "body.split"),
    ("/counter/task", {"split": "train", "index": 3}, 400, "past the end of split 'train'"),
    ("/counter/task", {"split": "train", "index": -1}, 400, "index must be 0 or more"),
    ("/counter/task", {"split": "train", "index": True}, 400, "body.index"),
    ("/other_env/task", {"split": "train", "index": 0}, 404, "unknown environment 'other_env'"),
    ("/other_env/splits", None, 404, "unknown environment"),
])
def test_bad_requests_are_typed(split_service, path, body, status, words):
    got, reply = call(split_service.url, path, body)
    assert got == status, reply
    assert reply["error"] == ("bad_request" if status == 400 else "not_found")
    assert words in reply["message"]


def test_env_segment_is_the_environment_without_case_or_harbors_clients(split_service):
    expected = call(split_service.url, "/counter/splits")
    assert call(split_service.url, "/Counter/splits") == expected
    assert call(split_service.url, "/harbor_env/splits") == expected


def test_a_dataset_without_splits_is_one_split_named_for_the_environment(shared_counter_service):
    url = shared_counter_service.url
    assert call(url, "/counter/splits") == \
        (200, [{"name": "counter", "type": "validation", "num_tasks": 5}])
    status, body = call(url, "/counter/task_range", {"split": "counter"})
    assert [t["task_id"] for t in body["tasks"]] == [row["task_id"] for row in listing(url)]


def test_schema_describes_the_bodies_and_the_replies(split_service):
    schema = call(split_service.url, "/schema")[1]["openenv_task_api"]
    for split in call(split_service.url, "/counter/splits")[1]:
        jsonschema.validate(split, schema["split"])
    for task in call(split_service.url, "/counter/task_range", {"split": "train"})[1]["tasks"]:
        jsonschema.validate(task, schema["task"])
    jsonschema.validate({"split": "train", "start": 0, "stop": None},
                        schema["task_range_request"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"split": "train", "start": -1}, schema["task_range_request"])


def test_a_split_named_like_the_environment_beside_rows_without_one_stops_the_build():
    class Listing:
        rows = ({"task_id": "a", "kind": None, "split": "counter"},
                {"task_id": "b", "kind": None, "split": None})
    with pytest.raises(ConfigError, match="named like the environment"):
        TaskSplits("counter", Listing())


@pytest.fixture(scope="module")
def openenv_python(cache_root):
    # openenv 0.10.0 requires gradio, openai, huggingface_hub, typer, ...;
    # its Task API client imports only what the extra lists beside it
    return framework_venv(cache_root, "openenv-tasks", no_deps=("openenv",))


def test_the_stock_openenv_client_reads_what_get_tasks_lists(openenv_python, split_service):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    proc = subprocess.run([str(openenv_python), str(LOOP), split_service.url], env=env,
                          cwd=openenv_python.parent, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    groups = by_split(split_service.url)
    assert [s["name"] for s in seen["splits"]] == list(groups)
    assert seen["num_tasks"] == {name: len(ids) for name, ids in groups.items()}
    assert seen["default_num_tasks"] == len(groups["train"])
    # HarborTaskRef keeps the fields it declares; instruction is its default
    assert seen["ranges"] == {name: [
        {"index": i, "task_id": tid, "task_name": tid, "dataset": name, "instruction": ""}
        for i, tid in enumerate(ids)] for name, ids in groups.items()}
    assert seen["second"]["task_id"] == groups["train"][1]
    assert seen["past_the_end"] == []
    assert seen["bad_split"] == 400
