"""Shop's fork (ShopEpisode.fork) through POST /episodes/{id}/fork on a real
``camg.serve`` Shop service (gunicorn, its JVM and the Lucene index of the
1k catalog): the session is copied, so parent and child go on alone; the
oracle on one branch and a no-op on the other earn 1.0 and 0.0."""

import json
from pathlib import Path

import pytest

from camg import verify
from camg_client import Client
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing
from tests.support.services import ServiceProcess


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    proc = ServiceProcess(testing.configure_service(tmp_path_factory.mktemp("shop-fork")))
    try:
        proc.wait_ready(timeout=240)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def goal_task():
    manifest = json.loads((testing.prepared()[0] / "manifest.json").read_text())
    task = manifest["tasks"][7]  # one whose oracle earns 1.0 (test_shop_http)
    products = ProductStore(testing.prepared()[1]["product_pool"])
    try:
        return task, products[task["data"]["goal"]["asin"]]["Title"]
    finally:
        products.close()


def to_results(client, eid, title, asin):
    """Search the target's title and page until it is listed."""
    query = title.replace("[", " ").replace("]", " ")
    step = client.step(eid, {"action": f"search[{query}]"})
    while asin.lower() not in step["observation"]["available_actions"]["clickables"]:
        step = client.step(eid, {"action": "click[next >]"})
    return step


def page(client, eid):
    return client.get(eid)["environment_state"]


def test_oracle_on_the_child_earns_one_and_noop_on_the_parent_zero(shop, goal_task):
    client = Client(shop.url)
    task, title = goal_task
    goal = task["data"]["goal"]
    parent = client.create(task_id=task["task_id"])["episode_id"]
    results = to_results(client, parent, title, goal["asin"])
    item = client.step(parent, {"action": f"click[{goal['asin'].lower()}]"})
    child = client.fork(parent)
    cid = child["episode_id"]
    assert child["observation"] == item["observation"] and child["fork_step"] == item["step"]
    assert page(client, cid) == page(client, parent) == {
        "page": "item", "steps": item["step"], "purchased": False}
    # the child chooses the goal's options and buys: the parent's page stays
    for value in goal["goal_options"].values():
        client.step(cid, {"action": f"click[{value}]"})
    assert page(client, parent)["steps"] == item["step"]
    bought = client.step(cid, {"action": "click[buy now]"})
    assert bought["done"] and bought["reward"] == 1.0
    assert page(client, parent) == {"page": "item", "steps": item["step"], "purchased": False}
    # the parent does nothing useful until its step limit: 0, as a straight no-op run
    answer = {"done": False}
    while not answer["done"]:
        answer = client.step(parent, {"action": "noop"})
    assert answer["reward"] == 0.0 and answer["failure_class"] is None
    records = {r["episode_id"]: r for r in shop.outcomes()}
    assert records[cid]["reward"] == 1.0 and records[parent]["reward"] == 0.0
    assert records[cid]["forked_from"] == parent and records[cid]["fork_step"] == item["step"]
    assert records[cid]["purchase"] == {"asin": goal["asin"], "options": {
        k: str(v).lower() for k, v in goal["goal_options"].items()}}
    assert records[parent]["purchase"] is None and "forked_from" not in records[parent]
    assert records[cid]["integrity"] == "ok"  # the product listed before the fork counts
    assert results["observation"]["page"] == "results"
    # the child's record verifies and regrades to the same reward
    assert verify.main([str(Path(shop.config["state_dir"]) / "outcomes.jsonl")]) == 0
    regraded = client.regrade(cid)
    assert regraded["reward"] == 1.0 and regraded["same_grader"] is True


def test_a_click_in_either_is_invisible_to_the_other(shop, goal_task):
    client = Client(shop.url)
    task, title = goal_task
    asin = task["data"]["goal"]["asin"].lower()
    parent = client.create(task_id=task["task_id"])["episode_id"]
    listed = to_results(client, parent, title, asin)["step"]
    cid = client.fork(parent)["episode_id"]
    # the parent leaves the results page: the child is still on it
    back = client.step(parent, {"action": "click[back to search]"})
    assert back["observation"]["page"] == "search"
    assert page(client, cid)["page"] == "results"
    # the child opens the product the parent no longer lists
    opened = client.step(cid, {"action": f"click[{asin}]"})
    assert opened["observation"]["page"] == "item" and opened["observation"]["valid_action"]
    assert page(client, parent)["page"] == "search"
    again = client.step(parent, {"action": f"click[{asin}]"})  # not on the parent's page
    assert again["observation"]["valid_action"] is False
    assert again["observation"]["page"] == "search"
    # each has its own step count (an ignored click is a step too)
    assert (page(client, parent)["steps"], page(client, cid)["steps"]) == (listed + 2, listed + 1)
    # a fork of the child, then the child moves: the grandchild stays on the item page
    grandchild = client.fork(cid)["episode_id"]
    client.step(cid, {"action": "click[< prev]"})
    assert page(client, grandchild)["page"] == "item" and page(client, cid)["page"] == "results"
    for eid in (parent, cid, grandchild):
        client.close(eid)
