"""Goal generation: deterministic for a seed, WebShop's order and splits, and
the checks a service runs on the task rows it is given."""

import random

import pytest

from camg.environment import Task
from camg.errors import DatasetError
from environments.shop import catalog, goals
from tests.support import shop_testing as testing


@pytest.fixture(scope="module")
def pool():
    return testing.pool()


@pytest.fixture(scope="module")
def by_asin(pool):
    return {p["asin"]: p for p in pool}


def test_pool_is_the_1k_catalog_with_instructions(pool):
    assert len(pool) == 1000
    assert sum(1 for p in pool if p.get("instruction_text")) == 415
    assert sum(len(p.get("instructions", [])) for p in pool) == 13
    # WebShop's document format: title, description, first bullet, options, lowercased
    doc = catalog.document(pool[0])
    assert doc["id"] == pool[0]["asin"] and doc["contents"] == doc["contents"].lower()
    assert pool[0]["Title"].lower() in doc["contents"]


def test_goals_are_deterministic_for_a_seed(pool):
    first = goals.generate(pool, source="synthetic", seed=7)
    second = goals.generate(pool, source="synthetic", seed=7)
    assert first == second
    assert len(first) == 6910
    other = goals.generate(pool, source="synthetic", seed=8)
    # same goals (shuffled by upstream's fixed 233), different price caps
    assert [g["asin"] for g in first] == [g["asin"] for g in other]
    assert [g["price_upper"] for g in first] != [g["price_upper"] for g in other]


def test_seeding_reproduces_upstreams_draw_order(pool):
    """Upstream with ``random.seed(s)`` before loading would draw exactly these."""
    seed = 11
    random.seed(seed)
    prices = {}
    for p in pool:  # generate_product_prices on the global generator
        pr = p["pricing"]
        prices[p["asin"]] = 100.0 if not pr else pr[0] if len(pr) == 1 else random.uniform(*pr[:2])
    caps = []
    for p in pool:
        if p.get("instruction_text") is None:
            continue
        price_range = [x for x in goals.PRICE_RANGE if x > prices[p["asin"]]][:4]
        caps.append(sorted(random.sample(price_range, 2))[1] if len(price_range) >= 2 else 1000000)
    rng = random.Random(seed)
    ours = goals.synthetic_goals(pool, catalog.product_prices(pool, rng), rng)
    assert sorted({(g["asin"], g["price_upper"]) for g in ours}) == sorted(
        {(p["asin"], c) for p, c in zip([p for p in pool if p.get("instruction_text")], caps)})


def test_goal_fields_and_text(pool, by_asin):
    goal = goals.generate(pool, source="synthetic", seed=0)[0]
    product = by_asin[goal["asin"]]
    assert goal["name"] == product["Title"]
    assert set(goal["goal_options"]) == set(product["options"])
    assert goal["instruction_text"].startswith(product["instruction_text"])
    if goal["price_upper"] != 1000000:
        assert goal["instruction_text"].endswith(f"price lower than {goal['price_upper']:.2f} dollars")


def test_splits_follow_webshop_indexes(pool):
    goal_list = goals.generate(pool, source="synthetic", seed=0)
    tasks = goals.webshop_tasks(goal_list, source="synthetic", splits=("test", "eval", "train"))
    assert [t["data"]["split"] for t in tasks[498:502]] == ["test", "test", "eval", "eval"]
    assert tasks[1499]["data"]["split"] == "eval" and tasks[1500]["data"]["split"] == "train"
    eval_only = goals.webshop_tasks(goal_list, source="synthetic", splits=("eval",))
    assert len(eval_only) == 1000
    assert eval_only[0]["task_id"] == "webshop-synthetic-00500"


def test_human_goals_from_the_subset(pool):
    human = goals.generate(pool, source="human", seed=0)
    # 13 instructions, of which those with instruction attributes become goals
    assert 0 < len(human) <= 13
    assert all(isinstance(g["goal_options"], list) for g in human)


def test_check_tasks_refuses_rows_that_do_not_match_the_pool(pool, by_asin):
    goal_list = goals.generate(pool, source="synthetic", seed=3)
    rows = goals.webshop_tasks(goal_list[:5], source="synthetic", splits=("test",))
    tasks = [Task(r["task_id"], r["data"]) for r in rows]
    goals.check_tasks(tasks, by_asin, 3)
    with pytest.raises(DatasetError, match="goal_seed 4"):
        goals.check_tasks(tasks, by_asin, 4)
    tampered = dict(rows[0]["data"], goal=dict(rows[0]["data"]["goal"], price_upper=1e9))
    with pytest.raises(DatasetError, match="differs"):
        goals.check_tasks([Task("t", tampered)], by_asin, 3)
    missing = dict(rows[0]["data"], goal=dict(rows[0]["data"]["goal"], asin="B000000000"))
    with pytest.raises(DatasetError, match="not in the pool"):
        goals.check_tasks([Task("t", missing)], by_asin, None)


def test_exact_product_rows(by_asin):
    asin, product = next((a, p) for a, p in by_asin.items() if len(p["options"]) == 2)
    name, values = next(iter(product["options"].items()))
    row = {"instruction": "buy it", "target_asin": asin.lower(), "attributes": [f"{name}: {values[0]}"]}
    task = goals.exact_product_task(row, 1, by_asin)
    assert task["data"] == {"kind": "exact_product", "instruction_text": "buy it",
                            "target_asins": [asin], "target_options": {name: values[0]}}
    with pytest.raises(DatasetError, match="not in the product pool"):
        goals.exact_product_task({"instruction": "x", "target_asin": "B000000000"}, 2, by_asin)
    with pytest.raises(DatasetError, match="no target product offers"):
        goals.exact_product_task({"instruction": "x", "target_asin": asin,
                                  "target_options": {name: "no such value"}}, 3, by_asin)
    with pytest.raises(DatasetError, match="instruction"):
        goals.exact_product_task({"target_asin": asin}, 4, by_asin)
    with pytest.raises(DatasetError, match="name: value"):
        goals.exact_product_task({"instruction": "x", "target_asin": asin,
                                  "attributes": ["no colon"]}, 5, by_asin)


def test_pool_validation_names_the_product(pool):
    bad = dict(pool[0], pricing=[1.0, 2.0, 3.0])
    with pytest.raises(DatasetError, match=pool[0]["asin"]):
        catalog.validate_product(bad, "row 0")
    with pytest.raises(DatasetError, match="BulletPoints"):
        catalog.validate_product(dict(pool[0], BulletPoints=[]), "row 0")
