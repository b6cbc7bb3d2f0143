"""Rewards: WebShop's ``get_reward`` and MemoryArena's exact-product reward.

WebShop's reward is (attribute + option + price matches) / (#attributes +
#goal options + 1) times a product-type factor r_type, with thefuzz
``token_set_ratio > 85`` fuzzy matching and the colour normalisation of
upstream normalize.py — reproduced here term by term.

One documented deviation: upstream's type factor compares the *nouns* of
the purchased and the goal product names, found with spaCy's
``en_core_web_lg`` tagger (tokens tagged NOUN or PROPN). That model is not
installable here, so ``title_nouns`` keeps every lowercased word token of
the name that is not a number and not an English function word
(determiners, pronouns, prepositions, conjunctions, auxiliaries) — it keeps
adjectives and verbs a tagger would drop. No term is dropped from the
reward: query match, category match and title score are all computed, and
only the title-score term can differ from upstream. For the bought-the-
target case every variant gives title_score 1.0, so the oracle's 1.0 does
not depend on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from thefuzz import fuzz

#: WebShop goal.py
EXACT_MATCH_OPTS = ["size"]

#: WebShop engine/normalize.py COLOR_SET (order matters: first substring wins)
COLOR_SET = [
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
]

# Closed-class English words: what a POS tagger never labels NOUN/PROPN.
_FUNCTION_WORDS = frozenset("""
a an the this that these those some any each every either neither no all both
half several many much more most few fewer less least other another such what
which whose whatever whichever i me my mine we us our ours you your yours he him
his she her hers it its they them their theirs myself yourself himself herself
itself ourselves themselves who whom one ones
about above across after against along amid among around as at before behind
below beneath beside besides between beyond by despite down during except for
from in inside into like near of off on onto out outside over past per plus
since than through throughout till to toward towards under underneath unlike
until up upon via with within without
and or but nor so yet if because although though while whereas unless whether
be is am are was were been being have has had having do does did doing will
would shall should can could may might must ought
not very too also just only even ever quite rather really s t
""".split())
_WORD = re.compile(r"[a-z0-9]+(?:['\-][a-z0-9]+)*")


def normalize_color(value: str) -> str:
    """First COLOR_SET colour contained in ``value``, else ``value`` (upstream)."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def title_nouns(name: str) -> list[str]:
    """Stand-in for upstream's spaCy NOUN/PROPN extraction (module docstring)."""
    words = []
    for token in _WORD.findall(name.lower()):
        token = token.removesuffix("'s")
        if token in _FUNCTION_WORDS or not any(c.isalpha() for c in token):
            continue
        words.append(token)
    return words


def type_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> dict:
    query_match = purchased["query"] == goal["query"]
    purchased_cats = {x.strip() for x in purchased["product_category"].split("›")}
    goal_cats = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_cats & goal_cats) >= 2
    purchased_type = title_nouns(purchased["name"])
    desired_type = title_nouns(goal["name"])
    n_intersect = len(set(purchased_type) & set(desired_type))
    title_score = 0.2 if not desired_type else n_intersect / len(desired_type)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def _in_text(value: str, product: Mapping[str, Any]) -> bool:
    return (value in product["Title"].lower()
            or value in " ".join(product["BulletPoints"]).lower()
            or value in product["Description"].lower())


def attribute_reward(purchased: Mapping[str, Any], goal_attrs: Sequence[str]) -> tuple[float, int]:
    matches = 0
    for g_attr in goal_attrs:
        matched = any(fuzz.token_set_ratio(p_attr, g_attr) > 85
                      for p_attr in purchased["Attributes"])
        if matched or _in_text(g_attr, purchased):
            matches += 1
    return matches / len(goal_attrs), matches


def option_reward(purchased: Mapping[str, Any], goal_options: Sequence[str],
                  chosen: Mapping[str, str]) -> tuple[float | None, int]:
    chosen = {k: normalize_color(v) for k, v in chosen.items()}
    goal_options = [normalize_color(o) for o in goal_options]
    matches = 0
    for name, value in chosen.items():
        if name.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_options
        else:
            matched = any(fuzz.token_set_ratio(g, value) > 85 for g in goal_options)
        if matched or _in_text(value, purchased):
            matches += 1
    r_option = matches / len(goal_options) if goal_options else None
    return r_option, matches


def webshop_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any], price: float,
                   chosen: Mapping[str, str]) -> tuple[float, dict]:
    """WebShop ``get_reward(..., verbose=True)``: (reward, components)."""
    r_type = type_reward(purchased, goal)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, n_attr = attribute_reward(purchased, goal["attributes"])
    goal_options = goal["goal_options"]
    goal_option_values = list(goal_options.values()) if isinstance(goal_options, Mapping) \
        else list(goal_options)
    r_option, n_option = option_reward(purchased, goal_option_values, chosen)
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    # upstream adds r_price as a bool (None would raise there: it never is for
    # generated goals, whose price_upper is positive)
    total = (n_attr + n_option + int(bool(r_price))) / denominator * r_type["r_type"]
    info = {**r_type, "r_att": r_att, "w_att": len(goal["attributes"]) / denominator}
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    if r_price is not None:
        info["r_price"] = bool(r_price)
        info["w_price"] = 1 / denominator
    return total, info


def exact_product_reward(asin: str, chosen: Mapping[str, str], target_asins: Sequence[str],
                         target_options: Mapping[str, str]) -> tuple[float, dict]:
    """MemoryArena-style: 1.0 for a target ASIN bought with exactly the
    target options (names and values compared lowercased and trimmed), else 0."""
    chosen_norm = {k.strip().lower(): v.strip().lower() for k, v in chosen.items()}
    asin_match = asin.upper() in {a.upper() for a in target_asins}
    missing = {k: v for k, v in target_options.items() if chosen_norm.get(k) != v}
    reward = 1.0 if asin_match and not missing else 0.0
    return reward, {"asin_match": asin_match, "options_match": not missing}
