"""A generated 20k-product catalog (environments/shop/checks/scale.py: synthesised,
indexed with WebShop's command, prepared into a product store; cached)
served end to end by a real ``camg.serve`` Shop service over HTTP: the
oracle buys the goal's product, a synthetic product found by its title is
bought and rewarded exactly as the reward function scores it from the
store, and the service reports the 20k products it serves."""

import json
import random

import pytest

from camg.config import task_manifest as manifest
from camg_client import Client
from environments.shop import rewards, search
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing
from tests.support.services import ServiceProcess
from environments.shop.checks import scale

SIZE = 20_000


@pytest.fixture(scope="module")
def preparation():
    index_dir, facts = scale.build_index(SIZE)
    assert facts["products"] == SIZE
    prepared, _ = scale.prepare(index_dir, testing.TEST_HEAP_MB)
    return prepared


@pytest.fixture(scope="module")
def service(preparation, tmp_path_factory):
    proc = ServiceProcess(testing.configure_service(tmp_path_factory.mktemp("shop-20k"),
                                                    preparation=preparation))
    try:
        proc.wait_ready(timeout=240)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def pool(preparation):
    settings = json.loads((preparation / "settings.json").read_text())
    products = ProductStore(settings["product_pool"])
    yield products, products.prices(random.Random(settings["goal_seed"]))
    products.close()


def play(client, task_id, asin, title, options=()):
    eid = client.create(task_id=task_id)["episode_id"]
    step = client.step(eid, {"action": f"search[{title.replace('[', ' ').replace(']', ' ')}]"})
    for _ in range(4):
        if asin.lower() in step["observation"]["available_actions"]["clickables"]:
            break
        step = client.step(eid, {"action": "click[next >]"})
    else:
        pytest.fail(f"{asin} not in the top 50 for its own title")
    client.step(eid, {"action": f"click[{asin.lower()}]"})
    for value in options:
        assert client.step(eid, {"action": f"click[{value}]"})["observation"]["valid_action"]
    return client.step(eid, {"action": "click[buy now]"})


def test_a_generated_catalog_is_served_end_to_end(service, preparation, pool):
    products, prices = pool
    assert len(products) == SIZE
    client = Client(service.url)
    meta = client.metadata()
    assert f'"products": {SIZE}' in json.dumps(meta)
    task = manifest.load(preparation / "manifest.json").tasks[7]
    goal = task.data["goal"]
    done = play(client, task.task_id, goal["asin"], products[goal["asin"]]["Title"],
                goal["goal_options"].values())
    assert done["done"] and done["reward"] == pytest.approx(rewards.webshop_reward(
        products[goal["asin"]], goal, prices[goal["asin"]], goal["goal_options"])[0])
    assert done["reward"] > 0.5
    # a synthetic product (an ASIN no real catalog has), bought as it is
    synthetic = list(products)[SIZE - 3]
    assert synthetic.startswith("X")
    done = play(client, task.task_id, synthetic, products[synthetic]["Title"])
    assert done["done"] and done["observation"]["purchase"]["asin"] == synthetic
    assert done["reward"] == pytest.approx(
        rewards.webshop_reward(products[synthetic], goal, prices[synthetic], {})[0])


def test_search_ranks_as_anserini_on_20k_products(preparation):
    """On 20x the 1k catalog (synthetic near-duplicates: many score ties)
    the service's search returns SimpleSearcher.search's hits in its order."""
    settings = json.loads((preparation / "settings.json").read_text())
    search.boot_jvm(settings["java_home"], testing.TEST_HEAP_MB)
    searcher = search.Searcher(settings["index_dir"])
    tasks = manifest.load(preparation / "manifest.json").tasks
    queries = [t.data["goal"]["instruction_text"].lower()
               for t in random.Random(1).sample(list(tasks), 80)]
    queries += ["kalo hair extension pack of 2", "pro"]
    try:
        differing = [q for q in queries if searcher.search(q) != searcher.simple_search(q)]
    finally:
        searcher.close()
    assert not differing, f"{len(differing)} differ, e.g. {differing[:3]}"
