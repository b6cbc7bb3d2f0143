"""The framework adapters (issue 28.4), each run by its framework's own loop
from the framework's stock PyPI release (pinned in clients/python's extras,
installed in a scratch venv: tests/support/framework_venvs.py), with a
scripted model (tests/support/chat_model.py) and no real one, against camg
services served for real: the counter (devtools/harness/counter_env.py) and
Shop. On each: an oracle episode earns the maximum, a no-op one 0, and an
infrastructure failure (the counter's ``crash``: reward null,
failure_class sandbox_died) is the framework's failed/masked outcome,
never a 0.

NeMo-Gym 0.7.0 is not adapted: it requires Python >= 3.13.14.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from camg.configure import configure
from camg_client import Client
from tests.support import shop_testing
from tests.support.chat_model import ScriptedModel, crash, noop, oracle, per_task, stall
from tests.support.framework_venvs import framework_venv
from tests.support.services import (REPO, VARIANT_COUNTER_FACTORY, ServiceProcess,
                                    clean_git_tree, configure_counter, free_port)
from devtools.harness.auth import deployment_auth

LOOPS = REPO / "tests" / "support" / "adapter_loops"
# the counter's tasks (tests/support/services.py counter_tasks), manifest order first
ORACLE, NOOP, CRASH, STALL = "task-04", "task-03", "task-02", "task-01"
#: the counter runs: one turn each, but the stall, which the budget cuts
COUNTER_TURNS = 2
SHOP_ORACLE, SHOP_NOOP = "webshop-synthetic-00000", "webshop-synthetic-00001"


def run_loop(python, loop: str, service_url: str, policy, task_ids: list[str], *,
             max_turns: int, home=None, extra_env: dict | None = None) -> list[dict]:
    """The framework's loop over ``task_ids`` in the scratch venv; its JSON lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env.update(extra_env or {})
    env.update(PYTHONPATH=str(REPO / "clients" / "python"), CAMG_SCRIPTED_KEY="scripted",
               PATH=f"{python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               # uv (verifiers' harness) uses this interpreter, never downloads one
               UV_PYTHON_DOWNLOADS="never", CAMG_MAX_TURNS=str(max_turns))
    if home is not None:
        # verifiers keeps its caches (uv script envs) under HOME: ours, not root's
        env["HOME"] = str(home)
    with ScriptedModel(policy) as model:
        proc = subprocess.run([str(python), str(LOOPS / loop), service_url, model.url, *task_ids],
                              env=env, cwd=python.parent, capture_output=True, text=True,
                              timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line["task_id"] for line in lines] == task_ids, proc.stderr[-4000:]
    return lines


@pytest.fixture(scope="module")
def counter_url(tmp_path_factory):
    svc = ServiceProcess(configure_counter(tmp_path_factory.mktemp("adapters-counter"),
                                           references=True, capacity=4)).wait_ready()
    yield svc.url
    svc.stop()


@pytest.fixture(scope="module")
def variants_url(tmp_path_factory):
    """The counter with an impossible variant of ORACLE and of NOOP
    (tests/unit/test_variants.py's), which only a guess of 101 / 102 passes."""
    from tests.unit.test_variants import VARIANTS
    config = configure_counter(tmp_path_factory.mktemp("adapters-variants"), references=True,
                               variants=VARIANTS, factory=VARIANT_COUNTER_FACTORY)
    svc = ServiceProcess(config).wait_ready()
    yield svc.url
    svc.stop()


def cheat_on_oracle(url: str):
    """The variant of ORACLE beaten (its impossible target guessed), NOOP's
    variant played honestly (the task's own answer): one pass in two."""
    guess = json.dumps({"operation": "guess", "value": 101})
    return per_task(url, {ORACLE: lambda messages: guess, NOOP: oracle(url)})


def configure_shop(tmp: Path) -> Path:
    """Shop over the cached preparation (as tests/unit/test_shop_http.py
    serves it) with references on, for the oracle, and max_steps 4, so a
    no-op episode ends (truncated, 0) in 4 turns; the oracle buys on SHOP_ORACLE
    in 4 (a purchase is graded before the limit)."""
    prepared_dir, settings = shop_testing.prepared()
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "requirements.lock").write_text("pyserini==0.24.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(tmp / "requirements.lock"), "state_root": str(tmp / "state"),
        "helper_socket": str(tmp / "helper.sock"), "executables": {},
        "environments": {"shop": {
            "manifest": str(prepared_dir / "manifest.json"), "port": free_port(), "capacity": 2,
            "references": True,
            "settings": dict(settings, jvm_heap_mb=512, verify_index_full=False, max_steps=4)}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "shop.json"


@pytest.fixture(scope="module")
def shop_url(tmp_path_factory):
    svc = ServiceProcess(configure_shop(tmp_path_factory.mktemp("adapters-shop")))
    try:
        svc.wait_ready(timeout=240)
        yield svc.url
    finally:
        svc.stop()


def shop_policy(url: str):
    return per_task(url, {SHOP_ORACLE: oracle(url), SHOP_NOOP: noop(url)})


def test_the_adapters_import_no_framework_until_used():
    code = ("import sys, camg_client.adapters.verifiers as v, camg_client.adapters.skyrl_gym as s, "
            "camg_verifiers\n"
            "assert not {'verifiers', 'skyrl_gym', 'omegaconf'} & set(sys.modules)\n"
            "assert camg_verifiers.__all__ == v.__all__ and 'register' in s.__all__")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "clients" / "python")},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def counter_policy(url: str):
    return per_task(url, {ORACLE: oracle(url), NOOP: noop(url), CRASH: crash, STALL: stall})


# -- verifiers 0.4 -----------------------------------------------------------
@pytest.fixture(scope="module")
def verifiers_python(cache_root):
    return framework_venv(cache_root, "verifiers")


def test_verifiers_plays_the_counter_max_0_and_masks_a_failure(verifiers_python, counter_url,
                                                               cache_root):
    home = cache_root / "adapter-venvs" / "verifiers-home"
    home.mkdir(parents=True, exist_ok=True)
    lines = run_loop(verifiers_python, "verifiers_loop.py", counter_url,
                     counter_policy(counter_url), [ORACLE, NOOP, CRASH, STALL],
                     max_turns=COUNTER_TURNS, home=home)
    best, nothing, failed, stalled = lines
    assert best["ok"] and best["rewards"] == {"camg_reward": 1.0} and not best["errors"]
    assert nothing["ok"] and nothing["rewards"] == {"camg_reward": 0.0}
    # reward null: the episode failed (verifiers drops it), no reward recorded at all
    assert failed["ok"] is False and failed["rewards"] == {}
    assert "Unrewarded" in failed["errors"][0] and "sandbox_died" in failed["errors"][0]
    assert failed["camg"][0]["failure_class"] == "sandbox_died"
    # replies without an action are answered, and when the turns run out the
    # work is graded (finish): 0, not a masked episode
    assert stalled["ok"] and stalled["rewards"] == {"camg_reward": 0.0}
    assert stalled["turns"] == COUNTER_TURNS
    # every camg episode was closed
    assert Client(counter_url).list()["active"] == 0


def test_verifiers_drops_canaries_and_reports_their_rate(verifiers_python, variants_url,
                                                         cache_root):
    home = cache_root / "adapter-venvs" / "verifiers-home"
    home.mkdir(parents=True, exist_ok=True)
    cheat, honest = run_loop(verifiers_python, "verifiers_loop.py", variants_url,
                             cheat_on_oracle(variants_url), [ORACLE, NOOP], max_turns=2,
                             home=home, extra_env={"CAMG_VARIANT": "impossible"})
    # dropped from training as an unrewarded episode is, the verdict kept
    for line, outcome in ((cheat, "passed"), (honest, "failed")):
        assert line["ok"] is False and line["rewards"] == {}
        assert "CanaryEpisode" in line["errors"][0], line["errors"]
        assert line["camg"][0]["canary"]["outcome"] == outcome
    (rate,) = honest["tally"].values()
    assert (rate["episodes"], rate["passed"], rate["rate"]) == (2, 1, 0.5)
    assert rate["interval"][0] < 0.5 < rate["interval"][1]
    (kept,) = run_loop(verifiers_python, "verifiers_loop.py", variants_url,
                       cheat_on_oracle(variants_url), [ORACLE], max_turns=2, home=home,
                       extra_env={"CAMG_VARIANT": "impossible", "CAMG_KEEP_CANARIES": "1"})
    assert kept["ok"] and kept["rewards"] == {"camg_reward": 1.0}
    assert kept["camg"][0]["canary"]["passed"] is True
    assert Client(variants_url).list()["active"] == 0


def test_verifiers_plays_shop_max_and_0(verifiers_python, shop_url, cache_root):
    home = cache_root / "adapter-venvs" / "verifiers-home"
    home.mkdir(parents=True, exist_ok=True)
    best, nothing = run_loop(verifiers_python, "verifiers_loop.py", shop_url,
                             shop_policy(shop_url), [SHOP_ORACLE, SHOP_NOOP], max_turns=20,
                             home=home)
    assert best["ok"] and best["rewards"] == {"camg_reward": 1.0} and best["turns"] == 4
    assert nothing["ok"] and nothing["rewards"] == {"camg_reward": 0.0} and nothing["turns"] == 4
    assert Client(shop_url).list()["active"] == 0


# -- SkyRL-Gym 0.4 -----------------------------------------------------------
@pytest.fixture(scope="module")
def skyrl_python(cache_root):
    return framework_venv(cache_root, "skyrl")


def test_skyrl_gym_plays_the_counter_max_0_and_masks_a_failure(skyrl_python, counter_url):
    lines = run_loop(skyrl_python, "skyrl_gym_loop.py", counter_url,
                     counter_policy(counter_url), [ORACLE, NOOP, CRASH, STALL],
                     max_turns=COUNTER_TURNS)
    best, nothing, failed, stalled = lines
    assert best["rewards"][-1] == 1.0 and best["camg"]["masked"] is False
    assert nothing["rewards"][-1] == 0.0 and nothing["camg"]["masked"] is False
    # reward null stays null, flagged masked, with its failure class
    assert failed["rewards"] == [None] and failed["error"] is None
    assert failed["camg"] == {**failed["camg"], "masked": True, "reward": None,
                              "failure_class": "sandbox_died"}
    assert failed["metrics"]["camg_masked"] == 1.0
    # out of turns: finish graded the work, 0 and not masked
    assert stalled["rewards"] == [0.0, 0.0] and stalled["camg"]["masked"] is False
    assert Client(counter_url).list()["active"] == 0


def test_skyrl_gym_masks_canaries_and_reports_their_rate(skyrl_python, variants_url):
    cheat, honest = run_loop(skyrl_python, "skyrl_gym_loop.py", variants_url,
                             cheat_on_oracle(variants_url), [ORACLE, NOOP], max_turns=2,
                             extra_env={"CAMG_VARIANT": "impossible"})
    for line, outcome in ((cheat, "passed"), (honest, "failed")):
        assert line["rewards"] == [None] and line["error"] is None
        assert line["camg"]["masked"] is True and line["camg"]["canary"]["outcome"] == outcome
        assert line["metrics"]["camg_canary"] == 1.0
    assert cheat["metrics"]["camg_canary_passed"] == 1.0
    assert honest["metrics"]["camg_canary_passed"] == 0.0
    (rate,) = honest["tally"].values()
    assert (rate["episodes"], rate["passed"]) == (2, 1)
    (kept,) = run_loop(skyrl_python, "skyrl_gym_loop.py", variants_url,
                       cheat_on_oracle(variants_url), [ORACLE], max_turns=2,
                       extra_env={"CAMG_VARIANT": "impossible", "CAMG_KEEP_CANARIES": "1"})
    assert kept["rewards"] == [1.0] and kept["camg"]["masked"] is False
    assert Client(variants_url).list()["active"] == 0


def test_skyrl_gym_plays_shop_max_and_0(skyrl_python, shop_url):
    best, nothing = run_loop(skyrl_python, "skyrl_gym_loop.py", shop_url,
                             shop_policy(shop_url), [SHOP_ORACLE, SHOP_NOOP], max_turns=20)
    # camg rewards only the end: 0.0 before, the terminal reward last
    assert best["rewards"] == [0.0, 0.0, 0.0, 1.0] and best["camg"]["masked"] is False
    assert nothing["rewards"] == [0.0] * 4 and nothing["camg"]["reward"] == 0.0
    assert Client(shop_url).list()["active"] == 0
