"""Goals (tasks) of the Shop environment.

Two kinds of task rows:

* ``webshop`` — a WebShop goal (instruction, target ASIN, attributes, goal
  options, price cap), rewarded by WebShop's reward. Generated from the
  product pool exactly as WebShop does (``get_synthetic_goals`` /
  ``get_human_goals``, then ``random.seed(233); random.shuffle``), except
  that product prices and price caps come from a generator seeded with
  ``goal_seed`` — upstream draws them unseeded before it seeds, so two
  servers never agreed on goals. Splits by index in the shuffled list:
  test 0–499, eval 500–1499, train 1500+.
* ``exact_product`` — a MemoryArena-style row (instruction, target ASINs,
  target attributes/options), rewarded 1.0 only for buying a target ASIN
  with exactly those options.

Goal source for the 1k catalog: its attribute file (items_ins_v2_1000.json)
gives 415 products a synthetic instruction; with every option combination
that is 6,910 goals, enough for all three splits. Only 13 human
instructions concern these products, so ``human`` goals are for the full
catalog (items_human_ins.json).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from camg.errors import DatasetError
from environments.shop.catalog import draw_price

#: WebShop goal.py
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: WebShop web_agent_text_env.SimServer: random.seed(233) before shuffling goals
SHUFFLE_SEED = 233
SPLITS = (("test", 0, 500), ("eval", 500, 1500), ("train", 1500, None))
GOAL_SOURCES = ("synthetic", "human")


def split_of(index: int) -> str:
    for name, start, stop in SPLITS:
        if index >= start and (stop is None or index < stop):
            return name
    raise ValueError(index)


def _sum_left(values: Any) -> float:
    """Left-to-right float addition, as upstream's ``sum`` computed it: since
    Python 3.12 ``sum`` of floats is compensated (Neumaier), which moves the
    last bit of some weights, so 3.12 would generate other goals than 3.11."""
    total = 0.0
    for value in values:
        total += value
    return total


def _price_cap(price: float, rng: random.Random) -> tuple[float, str]:
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) >= 2:
        _, upper = sorted(rng.sample(price_range, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


def synthetic_goals(
    products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], rng: random.Random
) -> list[dict]:
    goals: list[dict] = []
    cnt_atts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        attributes = list(product.get("instruction_attributes") or [])
        if not attributes:
            raise DatasetError(f"product {product['asin']}: instruction without attributes")
        price_upper, price_text = _price_cap(prices[product["asin"]], rng)
        options = product["options"]
        names = sorted(options)
        for combination in itertools.product(*(options[n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "product_category": product["product_category"],
                    # upstream's dict literal sets 'name' twice; the Title wins
                    "name": product["Title"],
                    "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": goal_options,
                }
            )
            for att in attributes:
                cnt_atts[att] += 1
    for goal in goals:
        goal["weight"] = _sum_left(1.0 / cnt_atts[a] for a in goal["attributes"]) / len(
            goal["attributes"]
        )
    return goals


def human_goals(
    products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], rng: random.Random
) -> list[dict]:
    goals = []
    for product in products:
        for row in product.get("instructions") or []:
            attributes = list(row.get("instruction_attributes") or [])
            if not attributes:
                continue
            price_upper, price_text = _price_cap(prices[product["asin"]], rng)
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["name"],
                    "product_category": product["product_category"],
                    "instruction_text": row["instruction"].strip(".") + price_text,
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": list(row.get("instruction_options") or []),
                    "weight": 1,
                }
            )
    return goals


def generate(products: Iterable[Mapping[str, Any]], *, source: str, seed: int) -> list[dict]:
    """WebShop's goal list (shuffled, split-indexed) for ``seed``."""
    if source not in GOAL_SOURCES:
        raise DatasetError(f"goal source must be one of {GOAL_SOURCES}, got {source!r}")
    rng = random.Random(seed)
    # Every product's price is drawn, in catalog order, before any goal is
    # (upstream's generate_product_prices, then the goal loop); only goal
    # products' prices are kept and only they reach the goal loop, which
    # skips the others without drawing: the same draws on a 1.18 M pool
    # without a 1.18 M-entry dict.
    kept, prices = [], {}
    for product in products:
        price = draw_price(product["pricing"], rng)
        if product.get("instruction_text") is not None or product.get("instructions"):
            kept.append(product)
            prices[product["asin"]] = price
    make = synthetic_goals if source == "synthetic" else human_goals
    goals = make(kept, prices, rng)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals


def webshop_tasks(goals: Sequence[dict], *, source: str, splits: Sequence[str]) -> list[dict]:
    """Manifest task rows for the goals of ``splits``, in goal-index order."""
    tasks = []
    for index, goal in enumerate(goals):
        split = split_of(index)
        if split in splits:
            tasks.append(
                {
                    "task_id": f"webshop-{source}-{index:05d}",
                    "data": {
                        "kind": "webshop",
                        "source": source,
                        "split": split,
                        "goal_index": index,
                        "goal": goal,
                    },
                }
            )
    return tasks


def exact_product_task(
    row: Mapping[str, Any], number: int, products: Mapping[str, Mapping[str, Any]]
) -> dict:
    """A MemoryArena-style row as a manifest task (see module docstring)."""
    where = f"exact-product row {number}"
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: must be an object")
    instruction = row.get("instruction_text", row.get("instruction"))
    if not isinstance(instruction, str) or not instruction.strip():
        raise DatasetError(f"{where}: instruction must be a non-empty string")
    targets = row.get("target_asins", row.get("target_asin", row.get("asin")))
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise DatasetError(f"{where}: target_asin(s) must be a string or a list of strings")
    targets = [t.upper() for t in targets]
    for asin in targets:
        if asin not in products:
            raise DatasetError(f"{where}: target {asin} is not in the product pool")
    options = _target_options(row.get("target_options", row.get("attributes", {})), where)
    for name, value in options.items():
        if not any(value in products[a]["options"].get(name, []) for a in targets):
            raise DatasetError(f"{where}: no target product offers {name}: {value}")
    task_id = row.get("task_id", f"exact-{number:05d}")
    return {
        "task_id": str(task_id),
        "data": {
            "kind": "exact_product",
            "instruction_text": instruction.strip(),
            "target_asins": targets,
            "target_options": options,
        },
    }


def _target_options(raw: Any, where: str) -> dict[str, str]:
    """Option name -> value, from ``{"color": "black"}`` or ``["color: black"]``."""
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        pairs = []
        for item in raw:
            if not isinstance(item, str) or ":" not in item:
                raise DatasetError(f"{where}: attribute {item!r} must look like 'name: value'")
            name, _, value = item.partition(":")
            pairs.append((name, value))
    else:
        raise DatasetError(f"{where}: target options must be an object or a list")
    options = {}
    for name, value in pairs:
        if not isinstance(name, str) or not isinstance(value, str):
            raise DatasetError(f"{where}: option names and values must be strings")
        options[name.strip().lower()] = value.strip().lower()
    return options


def check_tasks(
    tasks: Sequence[Any], products: Mapping[str, Mapping[str, Any]], goal_seed: int | None
) -> None:
    """Refuse task rows that do not match the loaded product pool.

    With ``goal_seed`` the WebShop goals are regenerated from the pool and
    each served goal must equal the regenerated one at its index: a pool,
    seed or generator change shows up here, before any reward is computed.
    """
    regenerated: dict[str, list[dict]] = {}
    for task in tasks:
        data = task.data
        kind = data.get("kind")
        if kind == "exact_product":
            for asin in data.get("target_asins", []):
                if asin not in products:
                    raise DatasetError(f"task {task.task_id}: target {asin} not in the pool")
            continue
        if kind == "memoryarena":
            if data.get("target_asin") not in products:
                raise DatasetError(f"task {task.task_id}: target not in the pool")
            continue
        if kind != "webshop":
            raise DatasetError(f"task {task.task_id}: unknown kind {kind!r}")
        goal = data.get("goal")
        if not isinstance(goal, Mapping) or goal.get("asin") not in products:
            raise DatasetError(f"task {task.task_id}: goal product is not in the pool")
        product = products[goal["asin"]]
        cap = goal.get("price_upper")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            # upstream's reward cannot be computed without a positive cap
            raise DatasetError(f"task {task.task_id}: goal price_upper must be a positive number")
        for key in ("query", "product_category"):
            if goal.get(key) != product[key]:
                raise DatasetError(f"task {task.task_id}: goal {key} differs from the pool's")
        if goal_seed is not None:
            source = data.get("source")
            if source not in regenerated:
                # a product store hands over only what generation reads
                inputs = getattr(products, "goal_inputs", None)
                regenerated[source] = generate(
                    inputs() if inputs else list(products.values()), source=source, seed=goal_seed
                )
            index = data.get("goal_index")
            ref = regenerated[source]
            if not isinstance(index, int) or not 0 <= index < len(ref) or ref[index] != goal:
                raise DatasetError(
                    f"task {task.task_id}: goal differs from the one generated "
                    f"from the pool with goal_seed {goal_seed}"
                )
