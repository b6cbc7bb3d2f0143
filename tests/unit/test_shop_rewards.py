"""WebShop's reward, term by term, and the exact-product reward, on real
products of the 1k catalog."""

import random

import pytest

from environments.shop import catalog, goals, rewards
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


def test_target_with_goal_options_earns_upstreams_reward(goal_list, by_asin, prices):
    """Buying the goal's product with the goal's options earns 1.0 except
    where upstream's own option term misses a goal option: a colour value
    normalised to a colour that is not one of the pair's words, e.g.
    ('color', 'r.brown2070') against the chosen 'r.brown2070' -> 'brown'."""
    full = 0
    for goal in goal_list[:400]:
        product = by_asin[goal["asin"]]
        reward, info = rewards.webshop_reward(product, goal, prices[goal["asin"]],
                                              dict(goal["goal_options"]))
        assert info["r_type"] == 1.0 and info["query_match"] and info["r_att"] == 1.0
        _, n_option = rewards.option_reward(goal["goal_options"], goal["goal_options"])
        n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
        assert reward == pytest.approx((n - len(goal["goal_options"]) + n_option) / n)
        full += reward == 1.0
    assert full >= 360
    assert rewards.option_reward({"color": "r.brown2070"}, {"color": "r.brown2070"}) == (0.0, 0)


def test_each_term_counts(goal_list, by_asin, prices):
    goal = next(g for g in goal_list if len(g["goal_options"]) == 2 and g["price_upper"] < 1e6)
    product = by_asin[goal["asin"]]
    n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    # no option chosen: both option terms are lost (upstream has no text
    # fallback for options)
    reward, info = rewards.webshop_reward(product, goal, prices[goal["asin"]], {})
    assert reward == pytest.approx((n - 2) / n) and info["r_option"] == 0.0
    # over the price cap: exactly the price term is lost
    reward, info = rewards.webshop_reward(product, goal, goal["price_upper"] + 1,
                                          dict(goal["goal_options"]))
    assert reward == pytest.approx((n - 1) / n) and info["r_price"] is False


def test_synthetic_goal_options_are_name_value_pairs():
    """Upstream hands the option term goal_options.items(): a pair is a
    colour only when its name or value is exactly one; otherwise its printed
    form is what thefuzz scores, so a chosen value matches when its words are
    among the pair's (name and value) words."""
    terms = rewards.goal_option_terms({"color": "black", "size": "x-large",
                                       "style": "royal blue trim"})
    assert terms == ["black", "('size', 'x-large')", "('style', 'royal blue trim')"]
    assert rewards.goal_option_terms(["dark navy blue", "large"]) == ["blue", "large"]
    # size is matched fuzzily against the pair, not exactly
    assert rewards.option_reward({"size": "x-large"}, {"size": "large"}) == (1.0, 1)
    # chosen values are colour-normalised: "light blue" -> "blue" is a word
    # of the pair ('style', 'royal blue trim')
    assert rewards.option_reward({"style": "royal blue trim"}, {"color": "light blue"}) == (1.0, 1)
    assert rewards.option_reward({"color": "black"}, {"color": "white"}) == (0.0, 0)
    # each goal option counts at most once, whatever is chosen
    assert rewards.option_reward({"color": "black"},
                                 {"a": "black", "b": "black", "c": "black"}) == (1.0, 1)
    assert rewards.option_reward({}, {"color": "black"}) == (None, 0)


def test_options_found_only_in_the_text_never_push_the_reward_above_one(goal_list, by_asin,
                                                                        prices):
    """Was 1.6667: task webshop-synthetic-02402 (a goal without options),
    buying B09QQP3356 with colour black and size small, both words of its
    texts."""
    goal = goal_list[2402]
    assert goal["goal_options"] == {}
    reward, info = rewards.webshop_reward(by_asin["B09QQP3356"], goal,
                                          prices["B09QQP3356"], {"color": "black", "size": "small"})
    assert reward == 1.0 and "r_option" not in info


def test_no_reward_outside_zero_one(goal_list, by_asin, prices):
    rng = random.Random(7)
    products = list(by_asin.values())
    for goal in rng.sample(goal_list, 300):
        for product in [by_asin[goal["asin"]]] + rng.sample(products, 3):
            # every option value the product offers, under every name: the
            # most option text an agent can send
            chosen = {f"{name}{i}": value for name, values in product["options"].items()
                      for i, value in enumerate(values)}
            reward, _ = rewards.webshop_reward(product, goal, prices[product["asin"]], chosen)
            assert 0.0 <= reward <= 1.0


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
