"""The Shop environment: WebShop's text store over the original pyserini
Lucene search, rewarded by WebShop's reward (or MemoryArena's exact-product
reward for exact_product rows).

An episode needs no sandbox: actions are text, and all state is the page
state of ``pages.Store``. The JVM, the index and the product pool are
shared by every episode of the process and loaded once in ``start``.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from camg.config.hashing import sha256_bytes, verify_recorded
from camg.environment import Environment, Episode, Grade, ServiceContext, Step, Submission, Task
from camg.errors import (
    ConfigError,
    DatasetError,
    GraderError,
    InfraFailure,
    InvalidAction,
    NotForkable,
)
from camg.typed import parse
from environments.shop import goals, javahome, memoryarena, rewards, search
from environments.shop.pages import PRODUCT_WINDOW, Store
from environments.shop.settings import Settings
from environments.shop.store import ProductStore

if TYPE_CHECKING:
    from camg.grading.judge import Judge

log = logging.getLogger("camg.shop")

ACTION_MAX = 1000
_GRADER_MODULES = ("rewards.py", "goals.py", "pages.py", "catalog.py", "memoryarena.py", "store.py")


class ShopEnvironment(Environment):
    name: ClassVar[str] = "shop"
    action_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "minLength": 1,
                "maxLength": ACTION_MAX,
                "description": "search[keywords] (on any page, as WebShop's text environment), "
                "or click[<clickable>] with one of "
                "observation.available_actions.clickables",
            }
        },
        "required": ["action"],
        "additionalProperties": False,
        # The two forms as tools (/schema's tools, MCP's; camg.web.action_tools).
        "x-camg-tools": {
            "property": "action",
            "tools": {
                "search": {
                    "template": "search[{}]",
                    "parameter": "query",
                    "description": "Search the shop (from any page) for products "
                    "matching the keywords.",
                    "parameter_description": "the search keywords",
                },
                "click": {
                    "template": "click[{}]",
                    "parameter": "text",
                    "description": "Click a button or link on the current page: one of "
                    "observation.available_actions.clickables.",
                    "parameter_description": "the button or link text, as in clickables",
                },
            },
        },
    }
    observation_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": {
            "text": {
                "type": "string",
                "description": "page text, visible texts joined by ' [SEP] '",
            },
            "instruction": {"type": "string"},
            "page": {"enum": ["search", "results", "item", "item_sub", "done"]},
            "available_actions": {
                "type": "object",
                "properties": {
                    "has_search_bar": {"type": "boolean"},
                    "clickables": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["has_search_bar", "clickables"],
            },
            "valid_action": {
                "type": "boolean",
                "description": "false when the last action changed nothing",
            },
            "error": {
                "type": "string",
                "description": "why the last action changed nothing (with valid_action false)",
            },
            "purchase": {"type": "object"},
            "reward_info": {"type": "object"},
        },
        "required": ["text", "instruction", "page", "available_actions"],
    }

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = parse(Settings, context.settings, "shop.settings", ConfigError)
        self.products: Mapping[str, dict] = {}
        self.prices: Mapping[str, float] = {}
        self.option_values: Container[str] = frozenset()
        self.searcher: search.Searcher | None = None
        self.judge: Judge | None = None
        self._facts: dict[str, Any] = {}

    # -- service lifecycle ---------------------------------------------
    def start(self) -> None:
        s = self.settings
        javahome.check_layout(s.java_home)
        self._check_hash("product_pool", s.product_pool, s.product_pool_sha256)
        self._check_hash("index", s.index_dir, s.index_sha256)
        # the pool is a store read by ASIN (store.py), not a dict per product
        self.products = ProductStore(s.product_pool)
        self.option_values = self.products.option_values
        try:
            goals.check_tasks(self.tasks, self.products, s.goal_seed)
        except DatasetError as exc:
            raise ConfigError(f"shop: {exc}") from None
        self.prices = self.products.prices(random.Random(s.goal_seed))
        if s.memoryarena_attributes == "judge" and any(
            t.data.get("kind") == "memoryarena" for t in self.tasks
        ):
            from camg.grading.judge import Judge, JudgeConfig

            # refuses to start (naming the variables) when credentials are missing
            self.judge = Judge(
                JudgeConfig.from_env(
                    s.memoryarena_judge_env, temperature=0.0, attempts=3, backoff_s=1.5
                )
            )
        search.boot_jvm(s.java_home, s.jvm_heap_mb)
        self.searcher = search.Searcher(s.index_dir, self.products)
        search.verify_index(self.searcher, self.products.documents(), full=s.verify_index_full)
        self._facts = {
            "product_pool": s.product_pool_sha256,
            "index": s.index_sha256,
            "grader": grader_hash(),
            "products": len(self.products),
            "index_documents": self.searcher.num_docs,
            "goal_seed": s.goal_seed,
            "java_version": javahome.feature_version(s.java_home),
            "jvm_heap_max_bytes": search.jvm_heap_max_bytes(),
            "memoryarena_attributes": s.memoryarena_attributes,
        }
        if self.judge is not None:
            self._facts["judge"] = self.judge.config.describe()
        log.info("shop ready: %d products, %d tasks", len(self.products), len(self.tasks))

    def stop(self) -> None:
        searcher, self.searcher = self.searcher, None
        if searcher is not None:
            searcher.close()
        if isinstance(self.products, ProductStore):
            self.products.close()

    def health(self) -> list[str]:
        return [] if self.searcher is not None else ["search engine is not running"]

    def metadata(self) -> Mapping[str, Any]:
        return dict(self._facts)

    def _check_hash(self, label: str, path: str, recorded: str) -> None:
        verified = self.context.verified_files.get(label)
        if (
            verified
            and verified["path"] == str(Path(path).resolve())
            and verified["sha256"] == recorded
        ):
            return  # camg.serve re-hashed this very file against the manifest before start
        verify_recorded(
            f"shop {label}",
            path,
            recorded,
            since="preparation",
            missing_hint=" (finish this step first: python -m camg.prepare_shop)",
        )

    # -- episodes ------------------------------------------------------
    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        if self.searcher is None:
            raise InfraFailure("the shop search engine is not running")
        return ShopEpisode(self, task, episode_id)

    def score(self, task: Task, asin: str, options: Mapping[str, str]) -> tuple[float, dict]:
        """The reward of buying ``asin`` with ``options`` for ``task``, and
        its details: an episode's purchase and a regrade both come here."""
        data = task.data
        try:
            product = self.products[asin]
            if data.get("kind") == "exact_product":
                reward, info = rewards.exact_product_reward(
                    asin, dict(options), data["target_asins"], data["target_options"]
                )
            elif data.get("kind") == "memoryarena":
                reward, info = memoryarena.score(
                    data,
                    asin,
                    product.get("name") or "",
                    product.get("catalog_category") or "",
                    self._judge_fn(),
                )
            else:
                reward, info = rewards.webshop_reward(
                    product, data["goal"], self.prices[asin], dict(options)
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise GraderError(f"cannot grade task {task.task_id}: {exc!r}") from None
        return float(reward), info

    def _judge_fn(self):
        judge = self.judge
        if judge is None:
            return None  # the documented substring setting

        def count(name: str, attributes: list[str]) -> int:
            # JudgeError (an InfraFailure) propagates: reward null, judge_error
            verdict = judge.ask(
                memoryarena.judge_prompt(name, attributes),
                parse=lambda text: memoryarena.parse_judgement(text, attributes),
            )
            return int(verdict.score)

        return count

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """The stored purchase through the reward function again (an episode
        that ended without one -- step limit, MemoryArena's soft exit --
        earns 0 by rule, as it did)."""
        purchase = submission.meta.get("purchase")
        if submission.meta.get("integrity") == "tampered":
            # the purchase was not reachable by the page path: 0 by rule, as it was
            return Grade(
                0.0,
                {
                    "purchase": purchase,
                    "integrity": "tampered",
                    "integrity_evidence": list(submission.meta.get("evidence") or ()),
                },
            )
        if not isinstance(purchase, Mapping):
            return Grade(
                0.0,
                {"purchase": None, "reward_info": dict(submission.meta.get("reward_info") or {})},
            )
        reward, info = self.score(
            task, str(purchase.get("asin")), dict(purchase.get("options") or {})
        )
        out: dict[str, Any] = {"purchase": dict(purchase), "reward_info": info}
        if "attribute_method" in info:
            out["attribute_method"] = info["attribute_method"]
        return Grade(reward, out)

    def search(self, keywords: str) -> list[str]:
        searcher = self.searcher
        if searcher is None:
            raise InfraFailure("the shop search engine stopped")
        return searcher.search(keywords)


def unreachable_purchase(
    asin: str,
    options: Mapping[str, str],
    listed: set[str],
    products: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """Evidence that a purchase is not one the episode's page path reached:
    its ASIN was never listed on a results page, or a chosen option is not
    one of that product's values (empty: reachable)."""
    found = []
    if asin.lower() not in listed:
        found.append(f"unreachable_purchase: {asin} was never listed on a results page")
    offered = (products.get(asin) or {}).get("options") or {}
    for name, value in options.items():
        if value not in (offered.get(name) or ()):
            found.append(f"unreachable_purchase: option {name}={value!r} is not offered by {asin}")
    return found


def integrity_verdict(evidence: Sequence[str], rejected: Mapping[str, list]) -> dict:
    """The outcome record's verdict. ``tampered`` only for a purchase the page
    path did not reach (reward 0); actions the store ignored are harmless (they
    changed nothing, as upstream) and common honest slips, so they leave the
    verdict ``ok`` and are counted, by rule, in the evidence."""
    lines = list(evidence) + [
        f"{rule}: {count} refused (first {first!r}" + (f" on the {page} page)" if page else ")")
        for rule, (count, first, page) in sorted(rejected.items())
    ]
    body: dict[str, Any] = {
        "integrity": "tampered" if evidence else "ok",
        "rejected_actions": {rule: seen[0] for rule, seen in rejected.items()},
    }
    if lines:
        body["integrity_evidence"] = lines
    return body


#: what a Store holds that no episode writes (the catalog, the search engine)
_SHARED_STORE_STATE = frozenset({"_products", "_search"})


def _copy_store(store: Store) -> Store:
    # Every container the page state mutates in place (chosen options) or
    # replaces (results) is copied; pages.py is not touched for it, since
    # it is part of the grader hash.
    child = copy.copy(store)
    for name, value in vars(store).items():
        if name not in _SHARED_STORE_STATE and isinstance(value, (list, dict, set)):
            setattr(child, name, copy.copy(value))
    return child


def grader_hash() -> str:
    """Hash of the code that decides rewards and observations."""
    here = Path(__file__).parent
    return sha256_bytes(b"".join((here / name).read_bytes() for name in _GRADER_MODULES))


class ShopEpisode(Episode):
    def __init__(self, env: ShopEnvironment, task: Task, episode_id: str) -> None:
        self.env = env
        self.task = task
        self.episode_id = episode_id
        self.store: Store | None = None
        self.steps = 0
        self.reward: float | None = None
        self.reward_info: dict = {}
        self.purchase: dict | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._last_action: str | None = None
        self._repeats = 0
        # ASINs some results page of this episode listed: a purchase must be one
        self._listed: set[str] = set()
        self.rejected: dict[str, list] = {}  # rule -> [count, first action, its page]
        self.evidence: list[str] = []  # of a tampered purchase
        self._log_extra = {"EPISODE_ID": episode_id, "TASK_ID": task.task_id}
        self.cpu_s = 0.0

    def reset(self) -> Mapping[str, Any]:
        with self._lock:
            self._check_open()
            instruction = self.task.data.get("goal", self.task.data).get("instruction_text")
            if not isinstance(instruction, str):
                raise InfraFailure(f"task {self.task.task_id} has no instruction_text")
            self.store = Store(
                instruction,
                self.env.products,
                self.env.search,
                show_attrs=self.env.settings.show_attrs,
            )
            self.steps = 0
            return self._observation(True)

    def step(self, action: Mapping[str, Any]) -> Step:
        # No sandbox to ask: the CPU its steps took on the calling thread
        # (the search's JVM threads, shared by every episode, are not in it).
        started = time.thread_time()
        try:
            return self._step(action)
        finally:
            self.cpu_s += time.thread_time() - started

    def _step(self, action: Mapping[str, Any]) -> Step:
        text = action.get("action") if isinstance(action, Mapping) else None
        if not isinstance(text, str) or not text or len(text) > ACTION_MAX:
            raise InvalidAction(f'action must be {{"action": <string of 1..{ACTION_MAX}>}}')
        if not text.isprintable():
            seen = self.rejected.setdefault("malformed_action", [0, text[:80], None])
            seen[0] += 1
            raise InvalidAction("action must not contain control characters")
        with self._lock:
            self._check_open()
            if self.store is None:
                raise InvalidAction("reset the episode before stepping")
            page = self.store.page
            if page == "results":  # what this action could reach
                self._listed.update(
                    a for a, (kind, _) in self.store.clickables().items() if kind == "product"
                )
            changed, bought = self.store.apply(text)
            self.steps += 1
            error = None
            if not changed:
                rule, error = self.store.rejection(text, self.env.option_values)
                seen = self.rejected.setdefault(rule, [0, text[:80], page])
                seen[0] += 1
            if bought:
                self._grade_purchase()
                reward = self.reward
                assert reward is not None  # _grade_purchase sets it
                log.info("bought %s, reward %.4f", self.store.asin, reward, extra=self._log_extra)
                return Step(self._observation(True), reward=reward, done=True, graded=True)
            self._repeats = self._repeats + 1 if text == self._last_action else 1
            self._last_action = text
            limit = self.env.settings.max_steps
            data = self.task.data
            if data.get("kind") == "memoryarena":
                # MemoryArena's per-subtask limits replace max_steps
                limit = data["turn_limit"]
                if self._repeats >= data["repeat_limit"]:
                    # its soft exit: the same action N times in a row, no purchase
                    self.reward, self.reward_info = 0.0, {"soft_exit": True, "purchased": False}
                    obs = dict(self._observation(changed, error), truncated=True)
                    return Step(obs, reward=0.0, done=True, graded=True)
            if limit and self.steps >= limit:
                self.reward, self.reward_info = 0.0, {"truncated": True}
                obs = dict(self._observation(changed, error), truncated=True)
                return Step(obs, reward=0.0, done=True, graded=True)
            return Step(self._observation(changed, error))

    def grade(self) -> float:
        # Every terminal step is graded when it happens; this is only reached
        # if the manager ends an episode some other way.
        return 0.0 if self.reward is None else self.reward

    def close(self) -> None:
        self._closed = True

    def fork(self, episode_id: str) -> Episode:
        """The session as it stands, copied: goal, page stack (page, query,
        results, page number, product, chosen options, sub page), the
        products listed so far (what a purchase may be), the refusals and
        the step and repeat counts. Parent and child share only what no
        episode writes: the catalog and the search engine. The child's cost
        is its own steps' CPU."""
        with self._lock:
            self._check_open()
            if self.store is None:
                raise NotForkable("the episode has not been reset", what="reset")
            child = ShopEpisode(self.env, self.task, episode_id)
            child.store = _copy_store(self.store)
            child.steps = self.steps
            child._last_action, child._repeats = self._last_action, self._repeats
            child._listed = set(self._listed)
            child.rejected = {rule: list(seen) for rule, seen in self.rejected.items()}
            child.evidence = list(self.evidence)
            return child

    def submission(self) -> Submission | None:
        # The purchase is all the reward function sees; a few hundred bytes
        # kept in the record itself, no stored file.
        if self.purchase is None and not self.reward_info:
            return None
        meta: dict[str, Any] = {
            "purchase": self.purchase,
            "reward_info": (None if self.purchase is not None else self.reward_info),
        }
        if self.evidence:
            meta.update(integrity="tampered", evidence=list(self.evidence))
        return Submission(meta=meta)

    def outcome(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {"purchase": self.purchase, "reward_info": self.reward_info}
        if "attribute_method" in self.reward_info:
            out["attribute_method"] = self.reward_info["attribute_method"]
        out.update(integrity_verdict(self.evidence, self.rejected))
        out["cost"] = {"cpu_s": round(self.cpu_s, 6)}  # camg.episodes.cost adds the phases
        return out

    def state(self) -> Mapping[str, Any]:
        store = self.store
        return {
            "page": store.page if store else None,
            "steps": self.steps,
            "purchased": self.purchase is not None,
        }

    def reference_action(self) -> Mapping[str, Any] | None:
        """The oracle from the current page: search the target's title, page
        to it, open it, choose the goal's options, buy (None if it is not
        among the results)."""
        store, data = self.store, self.task.data
        if store is None:
            return None
        if data.get("kind") == "exact_product":
            target, options = data["target_asins"][0], data.get("target_options") or {}
        elif data.get("kind") == "memoryarena":
            target, options = data["target_asin"], {}
        else:
            target, options = data["goal"]["asin"], data["goal"].get("goal_options") or {}
        target = target.upper()
        clickables = store.available_actions()["clickables"]
        if store.page == "search":
            return {"action": f"search[{self._title_query(target)}]"}
        if store.page == "results":
            if target.lower() in clickables:
                return {"action": f"click[{target.lower()}]"}
            if target not in store.results:
                # not among these results (or not found at all by its title)
                return (
                    None
                    if store.keywords == self._title_query(target)
                    else {"action": "click[back to search]"}
                )
            where = store.results.index(target) // PRODUCT_WINDOW + 1
            return {"action": "click[next >]" if where > store.page_number else "click[< prev]"}
        if store.page == "item_sub" or (store.page == "item" and store.asin != target):
            return {"action": "click[< prev]"}
        if store.page == "item":
            for value in options.values():
                if (
                    str(value).lower() not in store.options.values()
                    and str(value).lower() in clickables
                ):
                    return {"action": f"click[{str(value).lower()}]"}
            return {"action": "click[buy now]"}
        return None

    def _title_query(self, asin: str) -> str:
        # brackets end WebShop's action argument early; the store lowercases
        title = self.env.products[asin]["Title"].replace("[", " ").replace("]", " ")
        return " ".join(title.lower().split(" "))

    # -- internals -----------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InfraFailure("episode was closed")

    def _grade_purchase(self) -> None:
        store = self.store
        # a purchase is made from a product's page: a store and an ASIN exist
        assert store is not None and store.asin is not None
        options = dict(store.options)
        self.purchase = {"asin": store.asin, "options": options}
        self.evidence = unreachable_purchase(store.asin, options, self._listed, self.env.products)
        if self.evidence:
            # A guard over the store's own transitions, which never let this
            # happen: the purchase the page path could not reach earns 0.
            log.error("unreachable purchase: %s", "; ".join(self.evidence), extra=self._log_extra)
            self.reward, self.reward_info = 0.0, {"integrity": "tampered"}
        else:
            self.reward, self.reward_info = self.env.score(self.task, store.asin, options)
        store.score = self.reward

    def _observation(self, valid: bool, error: str | None = None) -> dict:
        store = self.store
        assert store is not None  # observed only once reset has built the store
        obs = {
            "text": store.text(),
            "instruction": store.instruction,
            "page": store.page,
            "available_actions": store.available_actions(),
            "valid_action": valid,
        }
        if error is not None:
            obs["error"] = error
        if self.purchase is not None:
            obs["purchase"] = self.purchase
            obs["reward_info"] = self.reward_info
        return obs
