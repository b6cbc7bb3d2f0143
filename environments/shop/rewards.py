"""Rewards: WebShop's ``get_reward`` and MemoryArena's exact-product reward.

WebShop's reward is (attribute + option + price matches) / (#attributes +
#goal options + 1) times a product-type factor r_type, with thefuzz
``token_set_ratio > 85`` fuzzy matching and the colour normalisation of
upstream normalize.py — upstream's semantics term by term, checked row by
row against upstream's own outputs (tests/unit/test_shop_reward_golden.py).

One documented deviation: upstream's type factor compares the *nouns* of
the purchased and the goal product names, found with a spaCy English
tagger (tokens tagged NOUN or PROPN). No spaCy model is installable from
its authors here, so ``title_nouns`` keeps every lowercased word token of
the name that is not a number and not an English function word
(determiners, pronouns, prepositions, conjunctions, auxiliaries) — it keeps
adjectives and verbs a tagger would drop. Only ``title_score`` (and so
r_type) can differ from upstream. title_score divides by the number of goal
nouns *with repeats*, so buying the goal's own product can score below 1.0
(its r_type stays 1.0: the query matches).
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
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
]

# Closed-class English words: what a POS tagger never labels NOUN/PROPN.
_FUNCTION_WORDS = frozenset(
    """
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
""".split()
)
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
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _in_text(value: str, product: Mapping[str, Any]) -> bool:
    return (
        value in product["Title"].lower()
        or value in " ".join(product["BulletPoints"]).lower()
        or value in product["Description"].lower()
    )


def attribute_reward(purchased: Mapping[str, Any], goal_attrs: Sequence[str]) -> tuple[float, int]:
    matches = 0
    for g_attr in goal_attrs:
        matched = any(
            fuzz.token_set_ratio(p_attr, g_attr) > 85 for p_attr in purchased["Attributes"]
        )
        if matched or _in_text(g_attr, purchased):
            matches += 1
    return matches / len(goal_attrs), matches


def goal_option_terms(goal_options: Mapping[str, str] | Sequence[str]) -> list[str]:
    """The goal options as upstream's option term compares them.

    Human goals carry a list of option values. Synthetic goals carry a dict,
    and upstream ``get_reward`` hands the option term ``goal_options.items()``:
    each goal option is then a (name, value) pair. Its colour normalisation
    (``colour in value``) tests the pair's *elements*, so a pair becomes a
    colour only when its name or value is exactly one; otherwise thefuzz
    compares the pair's printed form (thefuzz's ``full_process`` calls
    ``str`` on it), whose tokens are the name's and the value's words. We
    hand over that text explicitly: the same string thefuzz would score.
    """
    if isinstance(goal_options, Mapping):
        terms = []
        for pair in goal_options.items():
            color = next((c for c in COLOR_SET if c in pair), None)
            terms.append(color if color is not None else str(pair))
        return terms
    return [normalize_color(value) for value in goal_options]


def option_reward(
    goal_options: Mapping[str, str] | Sequence[str], chosen: Mapping[str, str]
) -> tuple[float | None, int]:
    """Upstream ``get_option_reward``: each goal option counts once, when
    some chosen option value (colour-normalised) scores token_set_ratio > 85
    against it. Only the chosen values take part, not their names, and
    nothing falls back to the product text; so 0 <= matches <= #goal options.
    """
    chosen_values = [normalize_color(v) for v in chosen.values()]
    terms = goal_option_terms(goal_options)
    matches = sum(
        1
        for term in terms
        if any(fuzz.token_set_ratio(value, term) > 85 for value in chosen_values)
    )
    r_option = matches / len(terms) if terms else None
    return r_option, matches


def webshop_reward(
    purchased: Mapping[str, Any], goal: Mapping[str, Any], price: float, chosen: Mapping[str, str]
) -> tuple[float, dict]:
    """WebShop ``get_reward(..., verbose=True)``: (reward, components).

    Every count is bounded by its weight's denominator part (an attribute or
    goal option matches at most once, the price term is 0 or 1) and r_type is
    one of 0, 0.1, 0.5, 1, so the reward lies in [0, 1] by construction.
    """
    price_upper = goal["price_upper"]
    if not price_upper > 0:
        # upstream adds r_price = None to an int here and crashes: such a
        # goal cannot be graded (goals.check_tasks refuses it at start)
        raise ValueError(f"goal price_upper must be positive, not {price_upper!r}")
    r_type = type_reward(purchased, goal)
    r_price = price <= price_upper
    r_att, n_attr = attribute_reward(purchased, goal["attributes"])
    goal_options = goal["goal_options"]
    r_option, n_option = option_reward(goal_options, chosen)
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (n_attr + n_option + int(r_price)) / denominator * r_type["r_type"]
    info = {**r_type, "r_att": r_att, "w_att": len(goal["attributes"]) / denominator}
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    info["r_price"] = r_price
    info["w_price"] = 1 / denominator
    return total, info


def exact_product_reward(
    asin: str,
    chosen: Mapping[str, str],
    target_asins: Sequence[str],
    target_options: Mapping[str, str],
) -> tuple[float, dict]:
    """MemoryArena-style: 1.0 for a target ASIN bought with exactly the
    target options (names and values compared lowercased and trimmed), else 0."""
    chosen_norm = {k.strip().lower(): v.strip().lower() for k, v in chosen.items()}
    asin_match = asin.upper() in {a.upper() for a in target_asins}
    missing = {k: v for k, v in target_options.items() if chosen_norm.get(k) != v}
    reward = 1.0 if asin_match and not missing else 0.0
    return reward, {"asin_match": asin_match, "options_match": not missing}
