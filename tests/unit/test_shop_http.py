"""End to end: two real ``camg.serve`` Shop services (gunicorn, one JVM each)
configured from the same prepared manifest, driven over HTTP."""

import json
import threading

import pytest

from camg_client import Client, ServiceError
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing
from tests.support.services import ServiceProcess


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    base = tmp_path_factory.mktemp("shop-http")
    procs = [ServiceProcess(testing.configure_service(base / f"svc{i}")) for i in range(2)]
    errors = []

    def ready(proc):
        try:
            proc.wait_ready(timeout=240)
        except Exception as exc:  # reported below with the service's log
            errors.append(exc)

    threads = [threading.Thread(target=ready, args=(p,)) for p in procs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        if errors:
            raise errors[0]
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def test_two_services_with_the_same_seed_serve_identical_goals(services):
    a, b = (Client(s.url) for s in services)
    meta_a, meta_b = a.metadata(), b.metadata()
    assert meta_a["task_selection_hash"] == meta_b["task_selection_hash"]
    assert meta_a["hashes"]["product_pool"] == meta_b["hashes"]["product_pool"]
    assert meta_a["hashes"]["index"] == meta_b["hashes"]["index"]
    for seed in (0, 1, 4242):
        ea, eb = a.create(seed=seed), b.create(seed=seed)
        assert ea["task_id"] == eb["task_id"]
        assert ea["observation"] == eb["observation"]
        sa = a.step(ea["episode_id"], {"action": "search[stainless steel water bottle]"})
        sb = b.step(eb["episode_id"], {"action": "search[stainless steel water bottle]"})
        assert sa["observation"] == sb["observation"] and sa["reward"] == 0.0
        a.close(ea["episode_id"])
        b.close(eb["episode_id"])


def test_oracle_episode_over_http_records_the_reward(services):
    service = services[0]
    client = Client(service.url)
    manifest = json.loads((testing.prepared()[0] / "manifest.json").read_text())
    task = manifest["tasks"][7]
    goal = task["data"]["goal"]
    products = ProductStore(testing.prepared()[1]["product_pool"])
    created = client.create(task_id=task["task_id"])
    eid = created["episode_id"]
    assert goal["asin"] not in json.dumps(created["observation"])
    title = products[goal["asin"]]["Title"].replace("[", " ").replace("]", " ")
    step = client.step(eid, {"action": f"search[{title}]"})
    while goal["asin"].lower() not in step["observation"]["available_actions"]["clickables"]:
        step = client.step(eid, {"action": "click[next >]"})
    client.step(eid, {"action": f"click[{goal['asin'].lower()}]"})
    for value in goal["goal_options"].values():
        client.step(eid, {"action": f"click[{value}]"})
    last = client.step(eid, {"action": "click[buy now]"})
    assert last["done"] is True and last["reward"] == 1.0
    [record] = [r for r in service.outcomes() if r["episode_id"] == eid]
    assert record["reward"] == 1.0
    # cost: the phases the service timed and the steps' CPU; no sandbox, so
    # no memory or disk measure at all (absent, not 0)
    cost = record["cost"]
    assert set(cost) == {"cpu_s", "phases"} and cost["cpu_s"] > 0
    assert cost["phases"]["steps_s"] > 0 and cost["phases"]["reset_s"] > 0
    assert cost["phases"]["wall_s"] >= cost["phases"]["steps_s"] + cost["phases"]["reset_s"]
    assert last["cost"] == cost == client.get(eid)["cost"]


def test_schema_and_bad_actions_over_http(services):
    client = Client(services[1].url)
    schema = client.schema()
    assert schema["action"]["required"] == ["action"]
    eid = client.create()["episode_id"]
    with pytest.raises(ServiceError) as info:
        client.step(eid, {"action": 5})
    assert info.value.status == 422
    step = client.step(eid, {"action": "click[nothing here]"})
    assert step["reward"] == 0.0 and step["done"] is False
    assert step["observation"]["valid_action"] is False


def test_stock_openenv_client_runs_a_whole_shop_episode(services):
    """openenv-core's GenericEnvClient over /ws: its step data is the bare
    action {"action": "search[...]"} (was taken for a wrapper and refused)."""
    from openenv.core import GenericEnvClient

    from tests.support.token_clients import with_token

    service = services[0]
    manifest = json.loads((testing.prepared()[0] / "manifest.json").read_text())
    task = manifest["tasks"][7]
    goal = task["data"]["goal"]
    products = ProductStore(testing.prepared()[1]["product_pool"])
    title = products[goal["asin"]]["Title"].replace("[", " ").replace("]", " ")
    with with_token(GenericEnvClient)(base_url=service.url).sync() as env:
        result = env.reset(task_id=task["task_id"])
        assert result.done is False and result.observation["page"] == "search"
        result = env.step({"action": f"search[{title}]"})
        assert result.observation["page"] == "results" and result.reward == 0.0
        while goal["asin"].lower() not in result.observation["available_actions"]["clickables"]:
            result = env.step({"action": "click[next >]"})
        env.step({"action": f"click[{goal['asin'].lower()}]"})
        for value in goal["goal_options"].values():
            result = env.step({"action": f"click[{value}]"})
            assert result.observation["valid_action"]
        state = env.state()
        assert state["task_id"] == task["task_id"] and state["status"] == "running"
        result = env.step({"action": "click[buy now]"})
        assert result.done is True and result.reward == 1.0
        eid = env.state()["episode_id"]
    assert any(r["episode_id"] == eid and r["reward"] == 1.0 for r in service.outcomes())


def test_openenv_http_routes_drive_a_shop_episode_per_client(services):
    """OpenEnv's HTTP StepRequest wraps the action: {"action": {"action": ...}};
    each client (cookie) has its own episode."""
    import requests

    url = services[0].url
    from devtools.harness.auth import headers

    first, second = requests.Session(), requests.Session()
    first.headers.update(headers())
    second.headers.update(headers())
    a = first.post(url + "/reset", json={"seed": 5})
    b = second.post(url + "/reset", json={"seed": 6})
    assert a.status_code == b.status_code == 200
    assert a.json().keys() == {"observation", "reward", "done"}
    step = first.post(url + "/step", json={"action": {"action": "search[cotton socks]"}})
    assert step.status_code == 200 and step.json()["observation"]["page"] == "results"
    assert second.get(url + "/state").json()["environment_state"]["page"] == "search"
    assert first.get(url + "/state").json()["environment_state"]["page"] == "results"
    for session in (first, second):
        eid = session.get(url + "/state").json()["episode_id"]
        Client(url).close(eid)


def test_sigterm_is_a_graceful_stop_despite_the_jvm(services):
    # Runs last in this module: it stops the second service. The JVM must
    # leave SIGTERM to Python (-Xrs), or it exits the worker with 143 before
    # the open episode is closed and recorded.
    from camg_client import Client
    proc = services[1]
    episode = Client(proc.url).create(seed=11)
    assert proc.stop() == 0, proc.output()[-2000:]
    closed = [o for o in proc.outcomes() if o["episode_id"] == episode["episode_id"]]
    assert closed and closed[0]["reason"] == "service stopping"


def test_shop_canaries_lose_through_the_service(services):
    """environments/shop/checks/canaries.py on the real service: every unreachable click,
    malformed target, injection-like search, action after done, replayed
    request_id and cross-episode click earns exactly what upstream's reward
    gives the accepted page path (replayed in a fresh episode and recomputed
    in process), refused actions carry an error and change nothing, and the
    outcome records say integrity ok."""
    from devtools.canary_table import render
    from environments.shop.checks import canaries

    service = services[0]
    results, checks = canaries.run(Client(service.url), testing.prepared()[0], service.outcomes)
    text, failed = render("shop", results)
    assert not failed and not checks, text + "\n" + "\n".join(checks)
    assert len(results) >= 12 and {r.integrity for r in results} == {"ok"}
    honest = results[0]
    assert honest.technique == "honest_goal_path" and honest.reward > results[1].reward > 0.0
    assert sum(int(r.detail.split()[1].rstrip(";")) for r in results) >= 40   # refusals seen
