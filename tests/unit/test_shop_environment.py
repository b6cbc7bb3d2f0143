"""Shop episodes on the real pyserini/Lucene index of the 1k catalog:
acceptance policies, WebShop's page semantics, invalid actions, no target
leak, determinism, and the start-up refusals."""

import json
import random
import shutil

import pytest

from camg.config import task_manifest as manifest
from camg.environment import ServiceContext, Task
from camg.errors import ConfigError, InvalidAction
from environments.shop import rewards, search, store
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing
from environments.shop.environment import ShopEnvironment
from environments.shop.pages import PRODUCT_WINDOW

CONTROLS = ("back to search", "next >", "< prev")


@pytest.fixture(scope="module")
def prepared():
    out, settings = testing.prepared()
    return out, dict(settings, jvm_heap_mb=testing.TEST_HEAP_MB)


@pytest.fixture(scope="module")
def tasks(prepared):
    return manifest.load(prepared[0] / "manifest.json").tasks


def make_env(prepared, tasks, tmp_path, **overrides):
    env = ShopEnvironment(ServiceContext("shop", str(tmp_path), dict(prepared[1], **overrides)),
                          tasks)
    env.start()
    return env


@pytest.fixture(scope="module")
def env(prepared, tasks, tmp_path_factory):
    env = make_env(prepared, tasks, tmp_path_factory.mktemp("shop"))
    yield env
    env.stop()


def edited_pool(settings, tmp_path):
    """A copy of the pool's store with the first product's title edited."""
    body = list(ProductStore(settings["product_pool"]).values())
    body[0]["Title"] += " (edited)"
    store.write_store(body, tmp_path / "product_pool.sqlite")
    return tmp_path / "product_pool.sqlite"


def start(env, task):
    episode = env.create_episode(task, seed=None, episode_id=f"e-{task.task_id}")
    return episode, episode.reset()


def act(episode, text):
    return episode.step({"action": text})


def oracle(env, task):
    """Search the goal's product by its title, open it, choose the goal's options, buy."""
    goal = task.data["goal"]
    episode, _ = start(env, task)
    title = env.products[goal["asin"]]["Title"]
    # brackets end WebShop's action argument early, so the oracle leaves them out
    step = act(episode, "search[%s]" % title.replace("[", " ").replace("]", " "))
    while goal["asin"].lower() not in step.observation["available_actions"]["clickables"]:
        step = act(episode, "click[next >]")
        assert step.observation["valid_action"], "target not in the top 50"
    step = act(episode, f"click[{goal['asin'].lower()}]")
    for value in goal["goal_options"].values():
        step = act(episode, f"click[{value}]")
        assert step.observation["valid_action"]
    return act(episode, "click[buy now]")


def first_result(env, task):
    """Search with the instruction and buy the first result as it is."""
    episode, _ = start(env, task)
    step = act(episode, f"search[{task.data['goal']['instruction_text']}]")
    products = [c for c in step.observation["available_actions"]["clickables"] if c not in CONTROLS]
    act(episode, f"click[{products[0]}]")
    return act(episode, "click[buy now]")


def test_oracle_earns_one_and_first_result_clearly_less(env, tasks, capsys):
    sample = random.Random(2026).sample(list(tasks), 50)
    oracle_rewards = []
    for task in sample:
        step = oracle(env, task)
        goal = task.data["goal"]
        # the most upstream's reward gives for this goal: 1.0 unless its own
        # option term misses a goal option (e.g. colour 'r.brown2070', which
        # normalises to 'brown'; see environments/shop/README.md)
        _, n_option = rewards.option_reward(goal["goal_options"], goal["goal_options"])
        n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
        best = (n - len(goal["goal_options"]) + n_option) / n
        assert step.done and step.graded and step.reward == pytest.approx(best), (
            task.task_id, step.observation)
        oracle_rewards.append(step.reward)
    assert sum(r == 1.0 for r in oracle_rewards) >= 45
    baseline = [first_result(env, task) for task in sample]
    assert all(s.done and s.graded for s in baseline)
    mean = sum(s.reward for s in baseline) / len(baseline)
    with capsys.disabled():
        print(f"\nshop acceptance: oracle mean {sum(oracle_rewards) / 50:.3f} on 50 goals; buy-first-result mean {mean:.3f}")
    assert mean < 0.8


def test_pages_follow_webshop(env, tasks):
    episode, obs = start(env, tasks[0])
    assert obs["page"] == "search" and obs["available_actions"] == {
        "has_search_bar": True, "clickables": ["search"]}
    assert obs["text"] == f"WebShop [SEP] Instruction: [SEP] {obs['instruction']} [SEP] Search"
    step = act(episode, "search[pillow cover]")
    obs = step.observation
    results = env.searcher.search("pillow cover")
    assert len(results) == search.SEARCH_RETURN_N
    clickables = obs["available_actions"]["clickables"]
    assert clickables[:2] == ["back to search", "next >"]
    assert clickables[2:] == [a.lower() for a in results[:PRODUCT_WINDOW]]
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP] " + results[0] in obs["text"]
    for page in range(2, 6):
        obs = act(episode, "click[next >]").observation
        assert f"Page {page} (Total results: 50)" in obs["text"]
    # upstream always shows Next >: past the last hit, an empty page
    assert "Page 5 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] " in obs["text"]
    assert obs["available_actions"]["clickables"][:3] == ["back to search", "< prev", "next >"]
    empty = act(episode, "click[next >]").observation
    assert empty["text"].endswith("Back to Search [SEP] Page 6 (Total results: 50) "
                                  "[SEP] < Prev [SEP] Next >")
    assert empty["available_actions"]["clickables"] == ["back to search", "< prev", "next >"]
    act(episode, "click[< prev]")
    obs = act(episode, "click[< prev]").observation
    assert "Page 4 " in obs["text"]
    asin = results[30]
    obs = act(episode, f"click[{asin.lower()}]").observation
    product = env.products[asin]
    assert obs["page"] == "item" and product["Title"] in obs["text"]
    assert f"Price: {product['Price']}" in obs["text"] and obs["text"].endswith("Buy Now")
    option_values = [v for values in product["options"].values() for v in values]
    assert obs["available_actions"]["clickables"] == [
        "back to search", "< prev", "description", "features", "reviews", "buy now",
        *dict.fromkeys(option_values)]
    obs = act(episode, "click[features]").observation
    assert obs["page"] == "item_sub" and product["BulletPoints"][0].strip() in obs["text"]
    assert obs["available_actions"]["clickables"] == ["back to search", "< prev"]
    obs = act(episode, "click[< prev]").observation
    assert obs["page"] == "item"
    obs = act(episode, "click[< prev]").observation
    assert obs["page"] == "results" and "Page 4 " in obs["text"]
    obs = act(episode, "click[back to search]").observation
    assert obs["page"] == "search"


def test_options_are_remembered_and_graded(env, tasks):
    task = next(t for t in tasks if len(t.data["goal"]["goal_options"]) == 2)
    goal = task.data["goal"]
    episode, _ = start(env, task)
    act(episode, "search[x]")
    episode.store.results = [goal["asin"]]  # jump straight to the product page
    episode.store.page = "results"
    act(episode, f"click[{goal['asin'].lower()}]")
    name, value = next(iter(goal["goal_options"].items()))
    obs = act(episode, f"click[{value}]").observation
    assert obs["valid_action"] and episode.store.options == {name: value}
    act(episode, "click[description]")
    act(episode, "click[< prev]")
    assert episode.store.options == {name: value}
    step = act(episode, "click[buy now]")
    assert step.observation["purchase"] == {"asin": goal["asin"], "options": {name: value}}
    assert 0.0 < step.reward < 1.0
    with pytest.raises(InvalidAction, match="over"):
        act(episode, "click[back to search]")


@pytest.mark.parametrize("action", [
    "click[buy now]", "click[search]", "search[]", "search", "buy now", "click[B0000000]",
    "think[which one?]", "click[next >]"])
def test_invalid_actions_change_nothing(env, tasks, action):
    episode, before = start(env, tasks[1])
    step = act(episode, action)
    assert step.reward == 0.0 and not step.done
    error = step.observation["error"]
    assert step.observation == dict(before, valid_action=False, error=error)
    assert "search" in error if action.startswith("click[search") else "nothing changed" in error
    # on a results page the same invalid actions change nothing either
    results = act(episode, "search[red dress]").observation
    # (next > is a real clickable on a results page)
    for text in sorted({action} - {"click[next >]"}):
        step = act(episode, text)
        assert step.reward == 0.0 and not step.done
        assert step.observation == dict(results, valid_action=False,
                                        error=step.observation["error"])
    outcome = episode.outcome()
    assert outcome["integrity"] == "ok" and sum(outcome["rejected_actions"].values()) >= 1
    assert len(outcome["integrity_evidence"]) == len(outcome["rejected_actions"])


def test_malformed_actions_are_rejected(env, tasks):
    episode, _ = start(env, tasks[2])
    for action in ({}, {"action": 3}, {"action": ""}, {"action": "x" * 1001},
                   {"action": "click[a\x00]"}, "click[x]"):
        with pytest.raises(InvalidAction):
            episode.step(action)


def test_target_never_marked_in_observations(env, tasks):
    """The same query shows the same page whatever the goal's target is."""
    a = tasks[0]
    b = next(t for t in tasks if t.data["goal"]["asin"] != a.data["goal"]["asin"])
    query = "search[%s]" % env.products[a.data["goal"]["asin"]]["Title"].replace("[", "").replace("]", "")
    pages = []
    for task in (a, b):
        episode, _ = start(env, task)
        obs = act(episode, query).observation
        pages.append(obs["text"].replace(obs["instruction"], "<instruction>"))
        assert "target" not in json.dumps(obs).lower()
        assert episode.state() == {"page": "results", "steps": 1, "purchased": False}
    assert pages[0] == pages[1]
    done = oracle(env, a).observation
    assert a.data["goal"]["asin"] in json.dumps(done["purchase"])
    assert done["text"] == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"


def test_exact_product_rows_get_the_exact_reward(prepared, tasks, tmp_path, env):
    product = next(p for p in env.products.values() if len(p["options"]) >= 1)
    name, values = next(iter(product["options"].items()))
    row = Task("exact-1", {"kind": "exact_product", "instruction_text": "get it",
                           "target_asins": [product["asin"]], "target_options": {name: values[-1]}})
    for choice, expected in ((values[-1], 1.0), (values[0] if len(values) > 1 else None, 0.0)):
        episode, _ = start(env, row)
        act(episode, "search[x]")
        episode.store.results, episode.store.page = [product["asin"]], "results"
        act(episode, f"click[{product['asin'].lower()}]")
        if choice is not None:
            act(episode, f"click[{choice}]")
        step = act(episode, "click[buy now]")
        assert step.reward == expected


def test_two_environments_with_the_same_seed_serve_identical_goals(prepared, tasks, tmp_path, env):
    other = make_env(prepared, manifest.load(prepared[0] / "manifest.json").tasks, tmp_path)
    try:
        assert [t.data for t in other.tasks] == [t.data for t in env.tasks]
        assert other.metadata() == env.metadata()
        for task_a, task_b in zip(env.tasks[:20], other.tasks[:20]):
            ea, oa = start(env, task_a)
            eb, ob = start(other, task_b)
            assert oa == ob
            assert act(ea, "search[cotton socks]").observation == \
                act(eb, "search[cotton socks]").observation
    finally:
        other.stop()


def test_max_steps_ends_unbought_with_zero(prepared, tasks, tmp_path, env):
    episode = env.create_episode(tasks[3], seed=None, episode_id="budget")
    episode.reset()
    limit = env.settings.max_steps
    for i in range(limit - 1):
        assert not act(episode, "click[nothing]").done
    last = act(episode, "click[nothing]")
    assert last.done and last.graded and last.reward == 0.0 and last.observation["truncated"]


def test_close_is_idempotent_and_stops_steps(env, tasks):
    episode, _ = start(env, tasks[4])
    episode.close()
    episode.close()
    from camg.errors import InfraFailure
    with pytest.raises(InfraFailure):
        act(episode, "search[x]")


def test_metadata_hashes(env, prepared):
    meta = env.metadata()
    assert meta["product_pool"] == prepared[1]["product_pool_sha256"]
    assert meta["index"] == prepared[1]["index_sha256"]
    assert meta["grader"].startswith("sha256:") and meta["products"] == 1000
    assert meta["index_documents"] == 1000 and meta["java_version"] == 17
    # the heap cap reached the JVM (Runtime.maxMemory is a bit below -Xmx)
    assert 0.8 * testing.TEST_HEAP_MB * 2**20 < meta["jvm_heap_max_bytes"] <= testing.TEST_HEAP_MB * 2**20
    assert env.health() == []


def test_start_refuses_a_changed_pool_or_index(prepared, tasks, tmp_path):
    out, settings = prepared
    pool = edited_pool(settings, tmp_path)
    with pytest.raises(ConfigError, match="product_pool (changed|.* differs)"):
        make_env(prepared, tasks, tmp_path, product_pool=str(pool))
    index = tmp_path / "index"
    shutil.copytree(settings["index_dir"], index)
    (index / "extra").write_text("x")
    with pytest.raises(ConfigError, match="index (changed|.* differs)"):
        make_env(prepared, tasks, tmp_path, index_dir=str(index))
    with pytest.raises(ConfigError, match="Conda-style"):
        make_env(prepared, tasks, tmp_path, java_home="/usr/lib/jvm/java-17-openjdk-amd64")
    with pytest.raises(ConfigError, match="unknown field"):
        ShopEnvironment(ServiceContext("shop", str(tmp_path), dict(settings, extra=1)), tasks)


def test_start_refuses_goals_from_another_seed(prepared, tasks, tmp_path):
    with pytest.raises(ConfigError, match="goal_seed 5"):
        make_env(prepared, tasks[:3], tmp_path, goal_seed=5)


def test_one_jvm_per_process(prepared):
    with pytest.raises(ConfigError, match="already runs a JVM"):
        search.boot_jvm(prepared[1]["java_home"], testing.TEST_HEAP_MB + 1)


def test_concurrent_episodes_search_consistently(env, tasks):
    """Steps of many episodes run on the manager's worker threads at once."""
    from concurrent.futures import ThreadPoolExecutor
    queries = ["cotton socks", "wall mirror", "hair extension", "protein shake", "pillow cover",
               "phone case", "coffee table", "dog leash"]
    expected = {q: env.searcher.search(q) for q in queries}

    def run(i):
        episode, _ = start(env, tasks[100 + i])
        query = queries[i % len(queries)]
        obs = act(episode, f"search[{query}]").observation
        shown = [c for c in obs["available_actions"]["clickables"] if c not in CONTROLS]
        return query, shown

    with ThreadPoolExecutor(max_workers=8) as pool:
        for query, shown in pool.map(run, range(32)):
            assert shown == [a.lower() for a in expected[query][:PRODUCT_WINDOW]]


def test_files_the_service_verified_are_not_hashed_again(prepared, tasks, tmp_path, monkeypatch):
    from environments.shop import environment as shop_env
    out, settings = prepared
    verified = manifest.load(out / "manifest.json").files
    import camg.config.hashing
    fail = lambda path: pytest.fail(f"hashed {path} again")  # noqa: E731
    monkeypatch.setattr(camg.config.hashing, "sha256_path", fail)
    if hasattr(shop_env, "sha256_path"):
        monkeypatch.setattr(shop_env, "sha256_path", fail)
    env = ShopEnvironment(ServiceContext("shop", str(tmp_path), settings, verified_files=verified),
                          tasks)
    env.start()
    env.stop()
    # A verified file elsewhere exempts nothing: an edited copy is still refused.
    monkeypatch.undo()
    pool = edited_pool(settings, tmp_path)
    edited = ShopEnvironment(ServiceContext("shop", str(tmp_path), dict(settings, product_pool=str(pool)),
                                            verified_files=verified), tasks)
    with pytest.raises(ConfigError, match="product_pool (changed|.* differs)"):
        edited.start()


def test_reference_actions_play_the_oracle(env, tasks):
    """Episode.reference_action (python -m camg_client --policy oracle) reaches the
    most upstream's reward gives for each goal, from any page it starts on."""
    for task in random.Random(7).sample(list(tasks), 20):
        episode, _ = start(env, task)
        act(episode, "search[pillow cover]")          # start from somewhere else
        for _ in range(60):
            action = episode.reference_action()
            assert action is not None, task.task_id
            step = episode.step(action)
            if step.done:
                break
        goal = task.data["goal"]
        _, n_option = rewards.option_reward(goal["goal_options"], goal["goal_options"])
        n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
        assert step.done and step.reward == pytest.approx((n - len(goal["goal_options"]) + n_option) / n)


def test_unreachable_clicks_are_refused_counted_and_leave_the_reward_upstreams(env, tasks):
    """A goal's product clicked while no results page lists it: refused with
    an error, nothing changes, the verdict stays ok with the rule counted; the
    purchase the page path really reaches earns its own reward."""
    task = tasks[5]
    goal = task.data["goal"]
    episode, first = start(env, task)
    target = goal["asin"].lower()
    refused = act(episode, f"click[{target}]").observation
    assert refused["valid_action"] is False and "not listed" in refused["error"]
    assert dict(refused, valid_action=True) == dict(first, valid_action=True, error=refused["error"])
    results = act(episode, "search[wooden picture frame]").observation
    listed = [c for c in results["available_actions"]["clickables"] if c not in CONTROLS]
    if target in listed:
        pytest.skip("the unrelated query lists the target")
    for value in goal["goal_options"].values():
        assert act(episode, f"click[{value}]").observation["valid_action"] is False
    assert act(episode, "click[buy now]").observation["valid_action"] is False
    act(episode, f"click[{listed[0]}]")
    step = act(episode, "click[buy now]")
    asin = listed[0].upper()
    assert step.observation["purchase"] == {"asin": asin, "options": {}}
    assert step.reward == rewards.webshop_reward(env.products[asin], goal, env.prices[asin], {})[0]
    outcome = episode.outcome()
    assert outcome["integrity"] == "ok"
    assert outcome["rejected_actions"]["unreachable_product"] == 1
    assert outcome["rejected_actions"]["not_clickable"] >= 1
    assert any(line.startswith("unreachable_product: 1 refused") for line in
               outcome["integrity_evidence"])


def test_a_purchase_the_page_path_did_not_reach_is_tampered_and_earns_0(env, tasks):
    """The guard over the store's transitions: a store forced onto the goal's
    product (as a bug in a transition would) buys it for 0.0, tampered, and a
    regrade of the stored submission keeps the 0."""
    task = tasks[6]
    goal = task.data["goal"]
    episode, _ = start(env, task)
    act(episode, "search[wooden picture frame]")
    store = episode.store
    store.page, store.asin, store.options = "item", goal["asin"], dict(goal["goal_options"])
    honest = env.score(task, goal["asin"], goal["goal_options"])[0]
    step = act(episode, "click[buy now]")
    assert step.done and step.reward == 0.0 < honest
    outcome = episode.outcome()
    assert outcome["integrity"] == "tampered"
    assert any("was never listed" in line for line in outcome["integrity_evidence"])
    grade = env.regrade(task, episode.submission())
    assert grade.reward == 0.0 and grade.outcome["integrity"] == "tampered"


def test_an_honest_episode_is_ok_without_evidence(env, tasks):
    episode, _ = start(env, tasks[7])
    step = None
    while step is None or not step.done:
        step = episode.step(episode.reference_action())
    outcome = episode.outcome()
    assert outcome == dict(outcome, integrity="ok", rejected_actions={})
    assert "integrity_evidence" not in outcome and step.reward == 1.0
