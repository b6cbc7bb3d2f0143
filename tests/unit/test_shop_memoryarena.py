"""MemoryArena's bundled-shopping tasks on a product DB and rows our own
builder generates in MemoryArena's shape (environments/shop/demo/memoryarena_fixture.py;
no upstream row is copied): preparation from that layout, one task per
subtask in order, the step instruction, its score with the substring rule
and through the judge client (a local fake judge), and its limits."""

import json
import subprocess
import sys

import pytest

from camg.config import task_manifest as manifest
from camg.environment import ServiceContext
from camg.errors import ConfigError, DatasetError, JudgeError
from environments.shop import memoryarena
from environments.shop.environment import ShopEnvironment
from tests.support import shop_testing as testing
from tests.support.fake_judge import FakeJudge, Reply
from environments.shop.demo import memoryarena_fixture

REPO = testing.REPO


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    out = tmp_path_factory.mktemp("memoryarena-db")
    memoryarena_fixture.build(out, products=120, rows=3, java_home=testing.java_home())
    return out


@pytest.fixture(scope="module")
def prepared(db, tmp_path_factory):
    out = tmp_path_factory.mktemp("memoryarena-prepared")
    proc = subprocess.run(
        [sys.executable, "-m", "camg.prepare_shop", "--output", str(out), "--goals", "none",
         "--memoryarena-db", str(db), "--memoryarena-rows", str(db / "rows.parquet"),
         "--java-home", testing.java_home(), "--jvm-heap-mb", str(testing.TEST_HEAP_MB)],
        cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "settings.json").read_text())


def make_env(prepared, tmp_path, **settings):
    out, base = prepared
    tasks = manifest.load(out / "manifest.json").tasks
    env = ShopEnvironment(ServiceContext("shop", str(tmp_path), dict(base, **settings)), tasks)
    env.start()
    return env


def test_rows_become_subtask_tasks_in_order(prepared, db):
    out, settings = prepared
    tasks = manifest.load(out / "manifest.json").tasks
    rows = [json.loads(line) for line in (db / "rows.jsonl").read_text().splitlines()]
    assert [t.task_id for t in tasks] == [f"memoryarena-{r['category']}-{k}"
                                          for r in rows for k in range(1, 7)]
    assert settings["index_dir"] == str(db / "search_engine" / "indexes-full")
    first, third = tasks[0].data, tasks[2].data
    assert first["target_asin"] == rows[0]["answers"][0]["target_asin"]
    assert third["attributes"] == rows[0]["answers"][2]["attributes"]
    preamble = rows[0]["questions"][0].split("Product 1:")[0].rstrip()
    assert third["instruction_text"] == (f"{preamble}\n\n{memoryarena.HEADER}\n"
                                         f"{memoryarena.REMINDER}\n"
                                         + rows[0]["questions"][2][rows[0]["questions"][2].index("Product 3:"):].strip())
    assert "Product 4:" not in third["instruction_text"]
    # JSONL gives the same tasks as Parquet
    jsonl = memoryarena.read_rows(db / "rows.jsonl")
    assert jsonl == memoryarena.read_rows(db / "rows.parquet")


def test_bad_rows_and_layouts_are_refused(db, tmp_path):
    row = json.loads((db / "rows.jsonl").read_text().splitlines()[0])
    with pytest.raises(DatasetError, match="answers must be a list as long"):
        memoryarena.subtask_tasks([dict(row, answers=row["answers"][:5])], {}, {})
    with pytest.raises(DatasetError, match="not in the product DB"):
        memoryarena.subtask_tasks([row], {}, {})
    with pytest.raises(DatasetError, match="missing .*items_shuffle.json"):
        memoryarena.check_db_layout(tmp_path)
    bad = tmp_path / "rows.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="cannot read"):
        memoryarena.read_rows(bad)


def test_score_rules():
    task = {"target_asin": "B0TARGET00", "attributes": ["gluten free", "dark-chocolate", "12 oz"],
            "target_name": "Acme Gluten Free Dark Chocolate Bar 12 oz",
            "target_category": "Grocery › Candy › Chocolate"}
    assert memoryarena.score(task, None, "", "", None) == (0.0, {"purchased": False})
    assert memoryarena.score(task, "b0target00", "x", "", None)[0] == 1.0
    reward, info = memoryarena.score(task, "B0OTHER000", "Other Gluten-Free Dark Chocolate Bar",
                                     "Grocery › Candy › Chocolate", None)
    assert info["attribute_method"] == "substring" and info["num_attr_matches"] == 2
    assert info["r_type"] == 1.0 and reward == pytest.approx(2 / 3)
    # unrelated name: r_type 0 whatever the attributes
    assert memoryarena.score(task, "B0OTHER000", "Blue Garden Hose", "Garden", None)[0] == 0.0
    # name_score in (0.1, 0.2] and a different category: r_type 0.5
    factor = memoryarena.type_factor("a b c d e f g h i j", "a b x", "A › B", "C")
    assert factor["name_score"] == pytest.approx(0.2) and factor["r_type"] == 0.5
    assert memoryarena.type_factor("a b c d e f g h i j k", "a", "A", "B")["r_type"] == 0.1
    assert memoryarena.parse_judgement('ok {"Gluten Free": true, "dark chocolate": "true", '
                                       '"12 oz": false}', task["attributes"]) == 2.0
    with pytest.raises(ValueError):
        memoryarena.parse_judgement("no json", task["attributes"])


def _buy(env, task, asin):
    episode = env.create_episode(task, seed=None, episode_id=f"ma-{task.task_id}-{asin}")
    obs = episode.reset()
    assert obs["instruction"] == task.data["instruction_text"]
    title = env.products[asin]["Title"].replace("[", " ").replace("]", " ")
    step = episode.step({"action": f"search[{title}]"})
    pages = 0
    while asin.lower() not in step.observation["available_actions"]["clickables"]:
        step = episode.step({"action": "click[next >]"})
        pages += 1
        assert pages < 5, "not in the top 50"
    episode.step({"action": f"click[{asin.lower()}]"})
    return episode, episode.step({"action": "click[buy now]"})


def test_episodes_score_as_memoryarena_with_substring_and_judge(prepared, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="SHOP_JUDGE_URL"):
        make_env(prepared, tmp_path)       # judge mode without credentials refuses to start
    env = make_env(prepared, tmp_path, memoryarena_attributes="substring")
    try:
        task = env.tasks[0]
        episode, step = _buy(env, task, task.data["target_asin"])
        assert step.done and step.reward == 1.0
        other = next(a for a in env.products if a != task.data["target_asin"])
        episode, step = _buy(env, task, other)
        product = env.products[other]
        expected, _ = memoryarena.score(task.data, other, product["name"],
                                        product["catalog_category"], None)
        assert step.done and step.reward == pytest.approx(expected)
        assert episode.outcome()["attribute_method"] == "substring"
        # soft exit: the same action 7 times in a row ends the subtask unbought
        episode = env.create_episode(task, seed=None, episode_id="ma-repeat")
        episode.reset()
        for n in range(1, 8):
            step = episode.step({"action": "click[nothing]"})
            assert step.done is (n == 7)
        assert step.reward == 0.0 and episode.reward_info["soft_exit"]
        # 20 turns per subtask
        episode = env.create_episode(task, seed=None, episode_id="ma-turns")
        episode.reset()
        for n in range(1, 21):
            step = episode.step({"action": f"search[thing {n}]"})
        assert step.done and step.reward == 0.0 and step.observation["truncated"]
    finally:
        env.stop()


def test_judge_counts_attributes_and_its_failure_is_judge_error(prepared, tmp_path, monkeypatch):
    with FakeJudge() as judge:
        monkeypatch.setenv("SHOP_JUDGE_URL", judge.url)
        monkeypatch.setenv("SHOP_JUDGE_MODEL", "judge-model")
        monkeypatch.setenv("SHOP_JUDGE_KEY", "sk-test")
        env = make_env(prepared, tmp_path)
        try:
            task = env.tasks[1]
            other = next(a for a in env.products if a != task.data["target_asin"])
            attributes = task.data["attributes"]
            judge.script(Reply(text=json.dumps({a: True for a in attributes})))
            episode, step = _buy(env, task, other)
            product = env.products[other]
            factor = memoryarena.type_factor(task.data["target_name"], product["name"],
                                             task.data["target_category"],
                                             product["catalog_category"])
            assert step.reward == pytest.approx(factor["r_type"])
            assert episode.outcome()["attribute_method"] == "judge"
            assert product["name"] in judge.requests[-1].body["messages"][-1]["content"]
            judge.script(*[Reply(status=500)] * 3)
            with pytest.raises(JudgeError):
                _buy(env, task, other)
        finally:
            env.stop()
