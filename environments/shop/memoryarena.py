"""MemoryArena's bundled-shopping tasks (commit 6cd9de14) as Shop episodes.

A MemoryArena row is ``{id, questions[n], answers[n] = {target_asin,
attributes[]}, category}`` (its HF config ``bundled_shopping`` has n = 6).
Each subtask is one episode with one purchase, served in row then subtask
order under the id ``memoryarena-<category>-<k>``. The instruction shown is
the subtask's: the shared preamble (the text before ``Product 1:`` in the
first question), a "What You Need to Buy at Current Step" header with a
one-sentence reminder, then the ``Product k:`` section of question k (the
header wording is MemoryArena's; the reminder sentence is ours, its text
is not public). Per-subtask limits as its shipped configs: 20 agent turns,
and a soft exit when the same action is sent 7 times in a row.

Its score (``compute_reward.py``), computed here exactly:

* no purchase: 0.0; the target ASIN: 1.0 whatever the options;
* otherwise r_type * m / |A|: m = attributes of A found in the bought
  product's *name* by the attribute judge (an LLM, through camg.grading.judge), or,
  with the documented ``substring`` setting, by normalised substring match
  (lower-case, ``-`` and ``/`` to spaces, whitespace collapsed). r_type
  compares name tokens and category segments (``name_score``,
  ``category_score``). Options and prices never count (HF rows carry none).

The product DB layout it loads (``data/shopping/``): ``items_shuffle.json``
(raw scraped products, processed here as its WebShop loader does),
``items_ins_v2.json``, ``search_engine/indexes-full``, ``product_catalog/
*.json`` (name and category by ASIN) and ``domain_data.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from camg.errors import DatasetError

TURN_LIMIT = 20
REPEAT_LIMIT = 7
HEADER = "What You Need to Buy at Current Step"
REMINDER = "Buy exactly one product: the one described below."
_PRODUCT = re.compile(r"Product (\d+):")
_TOKEN = re.compile(r"[a-z0-9]+")
DB_FILES = ("items_shuffle.json", "items_ins_v2.json", "domain_data.json")


# --- rows -> subtask tasks ------------------------------------------------
def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL or Parquet file, in file order."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        rows = []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise DatasetError(f"{path}:{number}: not JSON: {exc}") from None
        return rows
    except OSError as exc:
        raise DatasetError(f"cannot read MemoryArena rows {path}: {exc}") from None
    except DatasetError:
        raise
    except Exception as exc:  # pyarrow's own errors: a file that is not Parquet
        raise DatasetError(f"cannot read MemoryArena rows {path}: {exc}") from None


def _check_row(row: Any, number: int) -> tuple[str, list[str], list[dict]]:
    where = f"MemoryArena row {number}"
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: must be an object")
    category, questions, answers = row.get("category"), row.get("questions"), row.get("answers")
    if not isinstance(category, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", category):
        raise DatasetError(f"{where}: category must be a name like baking_item_3")
    if (
        not isinstance(questions, list)
        or not questions
        or not all(isinstance(q, str) for q in questions)
    ):
        raise DatasetError(f"{where}: questions must be a non-empty list of strings")
    if not isinstance(answers, list) or len(answers) != len(questions):
        raise DatasetError(f"{where}: answers must be a list as long as questions")
    for k, answer in enumerate(answers, 1):
        if (
            not isinstance(answer, Mapping)
            or not isinstance(answer.get("target_asin"), str)
            or not isinstance(answer.get("attributes"), list)
            or not all(isinstance(a, str) for a in answer["attributes"])
        ):
            raise DatasetError(f"{where}: answer {k} must be {{target_asin, attributes[str]}}")
    return category, questions, answers


def step_instruction(questions: Sequence[str], k: int, where: str) -> str:
    """The instruction of subtask ``k`` (1-based): preamble, header, Product k."""
    first = _PRODUCT.search(questions[0])
    if first is None or first.group(1) != "1":
        raise DatasetError(f"{where}: question 1 has no 'Product 1:' section")
    preamble = questions[0][: first.start()].rstrip()
    section_at = questions[k - 1].find(f"Product {k}:")
    if section_at < 0:
        raise DatasetError(f"{where}: question {k} has no 'Product {k}:' section")
    section = questions[k - 1][section_at:].strip()
    return f"{preamble}\n\n{HEADER}\n{REMINDER}\n{section}"


def subtask_tasks(
    rows: Iterable[Any], products: Mapping[str, Mapping[str, Any]], categories: Mapping[str, str]
) -> list[dict]:
    """Manifest tasks, one per subtask, in row order then subtask order."""
    tasks, seen = [], set()
    for number, row in enumerate(rows, 1):
        category, questions, answers = _check_row(row, number)
        if category in seen:
            raise DatasetError(f"MemoryArena row {number}: category {category} repeats")
        seen.add(category)
        for k, answer in enumerate(answers, 1):
            where = f"MemoryArena row {number} subtask {k}"
            target = answer["target_asin"].strip().upper()
            if target not in products:
                raise DatasetError(f"{where}: target {target} is not in the product DB")
            tasks.append(
                {
                    "task_id": f"memoryarena-{category}-{k}",
                    "data": {
                        "kind": "memoryarena",
                        "row_id": row.get("id"),
                        "category": category,
                        "subtask": k,
                        "subtasks": len(answers),
                        "instruction_text": step_instruction(questions, k, where),
                        "target_asin": target,
                        "attributes": list(answer["attributes"]),
                        "target_name": products[target].get("name") or f"Product {k}",
                        "target_category": categories.get(target, ""),
                        "turn_limit": TURN_LIMIT,
                        "repeat_limit": REPEAT_LIMIT,
                    },
                }
            )
    if not tasks:
        raise DatasetError("no MemoryArena rows")
    return tasks


# --- the product DB -------------------------------------------------------
def check_db_layout(db: Path) -> None:
    missing = [
        name
        for name in (*DB_FILES, "product_catalog", "search_engine/indexes-full")
        if not (db / name).exists()
    ]
    if missing:
        raise DatasetError(f"{db} is not a MemoryArena product DB: missing {', '.join(missing)}")


def _price(raw: Any) -> tuple[list[float], str]:
    """Upstream's price parsing: every '$'-separated amount, at most two."""
    if not raw:
        return [100.0], "$100.0"
    try:
        pricing = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in str(raw).split("$")[1:]]
    except InvalidOperation:
        raise DatasetError(f"unreadable price {raw!r}") from None
    if len(pricing) == 1:
        return pricing, f"${pricing[0]}"
    return pricing[:2], f"${pricing[0]} to ${pricing[1]}"


def process_products(raw: Sequence[Mapping[str, Any]], attributes: Mapping[str, Any]) -> list[dict]:
    """items_shuffle.json records as its WebShop loader processes them:
    Title = name, options lowercased with '/' as ' | ', Attributes from
    items_ins_v2 (else DUMMY_ATTR), Rating = average_rating (else 'N.A.'),
    no reviews; ASIN 'nan' or longer than 10 skipped, first duplicate kept."""
    products, seen = [], set()
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("asin"), str):
            raise DatasetError(f"items_shuffle.json #{index}: needs an asin")
        asin = item["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, price_tag = _price(item.get("pricing"))
        options = {}
        for name, contents in (item.get("customization_options") or {}).items():
            if contents is None:
                continue
            options[name.lower()] = [
                c["value"].strip().replace("/", " | ").lower() for c in contents
            ]
        bullets = item.get("small_description")
        images = item.get("images") or [None]
        entry = attributes.get(asin) or {}
        product = {
            "asin": asin,
            "name": item.get("name") or "",
            "Title": item.get("name") or "",
            # upstream keeps None here; the templates would print "None"
            "Description": item.get("full_description") or "",
            "BulletPoints": bullets if isinstance(bullets, list) else [bullets or ""],
            "pricing": pricing,
            "Price": price_tag,
            "options": options,
            "Attributes": entry.get("attributes") or ["DUMMY_ATTR"],
            "Rating": item.get("average_rating") or "N.A.",
            "Reviews": [],
            "category": item.get("category") or "",
            "query": (item.get("query") or "").lower().strip(),
            "product_category": item.get("product_category") or "",
            "MainImage": images[0],
        }
        if entry.get("instruction") is not None:
            product["instruction_text"] = entry["instruction"]
            product["instruction_attributes"] = entry.get("instruction_attributes")
        products.append(product)
    return products


def catalog_categories(db: Path) -> dict[str, str]:
    """ASIN -> product_category from product_catalog/*.json (all files: an
    HF row has no domain path that could narrow them, as upstream)."""
    categories: dict[str, str] = {}
    for path in sorted((db / "product_catalog").glob("*.json")):
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DatasetError(f"cannot read {path}: {exc}") from None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, Mapping):
                continue
            asin = entry.get("asin") or (entry.get("product_information") or {}).get("ASIN")
            if isinstance(asin, str) and isinstance(entry.get("product_category"), str):
                categories.setdefault(asin.upper(), entry["product_category"])
    return categories


# --- the score ------------------------------------------------------------
def normalise(text: str) -> str:
    return " ".join(text.lower().replace("-", " ").replace("/", " ").split())


def substring_matches(name: str, attributes: Sequence[str]) -> int:
    name = normalise(name)
    return sum(1 for attr in attributes if normalise(attr) in name)


def type_factor(
    target_name: str, bought_name: str, target_category: str, bought_category: str
) -> dict:
    t_tokens = set(_TOKEN.findall(normalise(target_name)))
    b_tokens = set(_TOKEN.findall(normalise(bought_name)))
    name_score = len(t_tokens & b_tokens) / len(t_tokens) if t_tokens and b_tokens else 0.0
    t_segs = {s.strip().lower() for s in target_category.split("›") if s.strip()}
    b_segs = {s.strip().lower() for s in bought_category.split("›") if s.strip()}
    category_score = len(t_segs & b_segs) / len(t_segs) if t_segs else 0.0
    r_type = 1.0
    if not (category_score >= 0.5 or name_score > 0.2):
        r_type = 0.5
    if name_score < 0.1:
        r_type = 0.1
    if name_score == 0:
        r_type = 0.0
    return {"r_type": r_type, "name_score": name_score, "category_score": category_score}


def score(
    task: Mapping[str, Any],
    bought: str | None,
    bought_name: str,
    bought_category: str,
    judge: Callable[[str, Sequence[str]], int] | None,
) -> tuple[float, dict]:
    """MemoryArena's reward for one subtask; ``judge(name, attributes)``
    returns how many attributes it finds (None: the substring rule)."""
    if bought is None:
        return 0.0, {"purchased": False}
    if bought.upper() == task["target_asin"]:
        return 1.0, {"asin_match": True, "attribute_method": None}
    attributes = task["attributes"]
    info: dict[str, Any] = {
        "asin_match": False,
        **type_factor(task["target_name"], bought_name, task["target_category"], bought_category),
    }
    if not bought_name:
        matched, method = 0, "no_name"
    elif judge is None:
        matched, method = substring_matches(bought_name, attributes), "substring"
    else:
        matched, method = judge(bought_name, attributes), "judge"
    base = matched / len(attributes) if attributes else 0.0
    info.update(
        {
            "num_attr_matches": matched,
            "attributes": len(attributes),
            "attribute_method": method,
            "num_option_matches": 0,
            "option_ignored": True,
        }
    )
    return info["r_type"] * base, info


def judge_prompt(name: str, attributes: Sequence[str]) -> str:
    listed = "\n".join(f"- {a}" for a in attributes)
    return (
        "Product name:\n" + name + "\n\nFor each attribute below, decide whether the product "
        "described by this name has it. Answer with one JSON object mapping each "
        "attribute, exactly as written, to true or false.\n\nAttributes:\n" + listed
    )


def parse_judgement(text: str, attributes: Sequence[str]) -> float:
    """How many attributes the judge's JSON maps to true (by normalised text);
    raises ValueError when no JSON object is found (the judge client retries)."""
    match = re.search(r"\{.*\}", text, re.S)
    if match is None:
        raise ValueError("no JSON object in the judge's answer")
    answer = json.loads(match.group(0))
    if not isinstance(answer, dict):
        raise ValueError("the judge's answer is not an object")
    truth = {
        normalise(str(k)): v is True or str(v).strip().lower() == "true" for k, v in answer.items()
    }
    return float(sum(1 for a in attributes if truth.get(normalise(a), False)))
