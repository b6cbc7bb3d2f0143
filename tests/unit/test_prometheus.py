"""A real Prometheus server (Debian's prometheus 2.42, packaging/apt/metrics.txt)
scrapes two real ``camg.serve`` services every second, the toy counter
environment and Shop (one JVM), while oracle and no-op episodes run; the
counts per outcome and the latency histograms are read back through
Prometheus' own query API (/api/v1/query), not from the exposition.

Coding and the helper's own endpoint: tests/privileged/test_prometheus_coding.py.
"""

from __future__ import annotations

import threading

import pytest

from camg_client import Client
from tests.support import shop_testing
from tests.support.services import ServiceProcess, configure_counter
from devtools.harness.prometheus import PrometheusServer

COUNTER_TASKS = [{"task_id": f"t{i}", "data": {"target": 10 + i, "kind": "arith"}}
                 for i in range(3)]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    base = tmp_path_factory.mktemp("prometheus")
    counter = ServiceProcess(configure_counter(base / "counter", tasks=COUNTER_TASKS,
                                               references=True, limits={"idle_ttl_s": 600}))
    shop = ServiceProcess(shop_testing.configure_service(base / "shop", references=True))
    started = []
    try:
        failures = []

        def ready(proc):
            try:
                proc.wait_ready(timeout=240)
            except Exception as exc:  # reported below with the service's log
                failures.append(exc)
        threads = [threading.Thread(target=ready, args=(p,)) for p in (counter, shop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        started = [counter, shop]
        if failures:
            raise failures[0]
        prom = PrometheusServer(base / "prom", {
            "counter": counter.url.removeprefix("http://"),
            "shop": shop.url.removeprefix("http://")}).start()
        try:
            prom.wait_up()
            yield {"counter": counter, "shop": shop, "prom": prom}
        finally:
            prom.stop()
    finally:
        for proc in started or (counter, shop):
            proc.stop()


def oracle(client: Client, episode_id: str, limit: int = 60) -> tuple[dict, int]:
    """The reference solution to the end: (terminal reply, steps taken)."""
    for n in range(1, limit + 1):
        reply = client.step(episode_id, client.reference(episode_id)["action"])
        if reply["done"]:
            return reply, n
    raise AssertionError(f"the oracle did not finish in {limit} steps")


def test_counts_per_outcome_and_latency_histograms_through_prometheus(services):
    prom = services["prom"]
    steps = {}
    # counter: two oracle episodes, one that finishes without guessing, one closed
    counter = Client(services["counter"].url)
    n = 0
    for task in ("t0", "t1"):
        eid = counter.create(task_id=task)["episode_id"]
        reply, taken = oracle(counter, eid)
        assert reply["reward"] == 1.0, reply
        n += taken
    noop = counter.create(task_id="t2")["episode_id"]
    assert counter.step(noop, {"operation": "finish"})["reward"] == 0.0
    counter.close(counter.create(task_id="t2")["episode_id"])
    steps["counter"] = n + 1
    # Shop: the oracle buys the goal; the no-op trainer closes without acting
    shop = Client(services["shop"].url)
    eid = shop.create(seed=3)["episode_id"]
    reply, steps["shop"] = oracle(shop, eid)
    assert reply["reward"] == 1.0, reply
    shop.close(shop.create(seed=4)["episode_id"])

    def ended(env):
        return prom.wait_for(
            f'sum by (outcome) (camg_episodes_ended_total{{environment="{env}"}})',
            lambda got: got == want[env], by="outcome")
    want = {"counter": {"done": 3, "closed": 1}, "shop": {"done": 1, "closed": 1}}
    # the counter grades at the end; Shop's buy step carries its reward (no grade phase)
    grades = {"counter": 3, "shop": 0}
    for env in want:
        ended(env)
        # all of them ended without a failure class (the no-op's 0 is a grade)
        assert prom.value(f'sum(camg_episodes_ended_total{{environment="{env}",'
                          f'failure_class!="none"}})') is None
        assert prom.value(f'sum(camg_episodes_started_total{{environment="{env}"}})') \
            == sum(want[env].values())
        assert prom.value(f'camg_reset_seconds_count{{environment="{env}"}}') \
            == sum(want[env].values())
        assert prom.value(f'camg_step_seconds_count{{environment="{env}"}}') == steps[env]
        assert prom.value(f'camg_grade_seconds_count{{environment="{env}"}}') == grades[env]
        assert prom.value(f'camg_episodes_live{{environment="{env}"}}') == 0
        prom.assert_plausible_histogram("camg_step_seconds", f'environment="{env}"', steps[env],
                                        upper_s=10)
        prom.assert_plausible_histogram("camg_reset_seconds", f'environment="{env}"',
                                        sum(want[env].values()), upper_s=60)
    assert prom.value('camg_capacity{environment="shop"}') == 4
    assert prom.value('camg_admission_queue_bound{environment="shop"}') == 16
    assert prom.value('camg_admission_queued{environment="shop"}') == 0
    # Shop's search runs in the service: a step takes longer than a counter's guess
    assert prom.value('camg_step_seconds_sum{environment="shop"}') > \
        prom.value('camg_step_seconds_sum{environment="counter"}')

