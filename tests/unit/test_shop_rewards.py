"""WebShop's reward, term by term, and the exact-product reward, on real
products of the 1k catalog."""

import random

import pytest

from daemons.shop import catalog, goals, rewards
from tests.support import shop_testing as testing


@pytest.fixture(scope="module")
def pool():
    return testing.pool()


@pytest.fixture(scope="module")
def by_asin(pool):
    return {p["asin"]: p for p in pool}


@pytest.fixture(scope="module")
def goal_list(pool):
    return goals.generate(pool, source="synthetic", seed=0)


@pytest.fixture(scope="module")
def prices(pool):
    return catalog.product_prices(pool, random.Random(0))


def test_normalize_color_is_upstreams():
    assert rewards.normalize_color("dark navy blue") == "blue"  # first in COLOR_SET order
    assert rewards.normalize_color("x-large") == "x-large"
    assert rewards.normalize_color("rose gold") == "gold"


def test_title_nouns_drop_function_words_and_numbers():
    assert rewards.title_nouns("The Women's 2 Pack of Cotton Socks for Men, 10-13") == [
        "women", "pack", "cotton", "socks", "men"]
    assert rewards.title_nouns("of the 12 and") == []


def test_target_with_goal_options_earns_one(goal_list, by_asin, prices):
    for goal in goal_list[:200]:
        product = by_asin[goal["asin"]]
        reward, info = rewards.webshop_reward(product, goal, prices[goal["asin"]],
                                              dict(goal["goal_options"]))
        assert reward == 1.0, (goal, info)
        assert info["r_type"] == 1.0 and info["query_match"]


def test_each_term_counts(goal_list, by_asin, prices):
    goal = next(g for g in goal_list if len(g["goal_options"]) == 2 and g["price_upper"] < 1e6)
    product = by_asin[goal["asin"]]
    n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    # no option chosen: the option terms are lost (unless the value is in the texts)
    reward, info = rewards.webshop_reward(product, goal, prices[goal["asin"]], {})
    assert reward <= (n - 2 + sum(
        v in product["Title"].lower() or v in product["Description"].lower()
        or v in " ".join(product["BulletPoints"]).lower()
        for v in goal["goal_options"].values())) / n
    # over the price cap: exactly the price term is lost
    reward, info = rewards.webshop_reward(product, goal, goal["price_upper"] + 1,
                                          dict(goal["goal_options"]))
    assert reward == pytest.approx((n - 1) / n) and info["r_price"] is False


def test_a_different_product_type_is_penalised(goal_list, by_asin, prices):
    goal = goal_list[0]
    other = next(p for p in by_asin.values()
                 if p["query"] != goal["query"] and p["category"] != goal["category"])
    reward, info = rewards.webshop_reward(other, goal, prices[other["asin"]], {})
    assert info["r_type"] < 1.0 and reward < 0.5


def test_human_goal_options_are_a_list(pool, by_asin, prices):
    human = goals.generate(pool, source="human", seed=0)
    goal = human[0]
    reward, _ = rewards.webshop_reward(by_asin[goal["asin"]], goal, prices[goal["asin"]], {})
    assert 0.0 <= reward <= 1.0


def test_exact_product_reward():
    reward, info = rewards.exact_product_reward("B0ABC", {"Color": "Black "}, ["b0abc"],
                                                {"color": "black"})
    assert reward == 1.0 and info == {"asin_match": True, "options_match": True}
    assert rewards.exact_product_reward("B0ABC", {"color": "white"}, ["B0ABC"],
                                        {"color": "black"})[0] == 0.0
    assert rewards.exact_product_reward("B0XYZ", {"color": "black"}, ["B0ABC"],
                                        {"color": "black"})[0] == 0.0
    assert rewards.exact_product_reward("B0ABC", {}, ["B0ABC"], {})[0] == 1.0
