"""GET /metrics (camg/metrics.py): a real camg.serve of the counter
environment scraped over loopback HTTP and parsed with prometheus-client's
own parser; the judge's series through the fake judge; packaging/README.md's
table against the metrics the code defines."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from camg import metrics
from camg.errors import JudgeError
from camg_client import Client, ServiceError
from tests.support.fake_judge import FakeJudge, Reply
from tests.support.services import ServiceProcess, configure_counter
from tests.unit.test_judge import make

REPO = Path(__file__).resolve().parents[2]
SECRET = "secret-task"  # in every task id: no label may carry it


def scrape(url: str) -> tuple[str, dict]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        body = response.read().decode()
        content_type = response.headers["Content-Type"]
    samples: dict = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return content_type, samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def tasks() -> list[dict]:
    return [{"task_id": f"{SECRET}-ok", "data": {"target": 7, "kind": "arith"}},
            {"task_id": f"{SECRET}-grader", "data": {"target": 8, "kind": "arith",
                                                      "grade_fails": True}},
            {"task_id": f"{SECRET}-reset", "data": {"target": 9, "kind": "logic",
                                                     "reset_fails": True}},
            {"task_id": f"{SECRET}-open", "data": {"target": 10, "kind": "logic"}}]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    config = configure_counter(tmp_path_factory.mktemp("metrics"), tasks=tasks(),
                               limits={"idle_ttl_s": 1.0})
    proc = ServiceProcess(config).wait_ready()
    try:
        yield proc
    finally:
        proc.stop()


def test_series_move_as_episodes_end_and_carry_no_task_id(service):
    env = {"environment": "counter"}
    content_type, before = scrape(service.url)
    # No Accept header: the classic text format every Prometheus reads.
    assert content_type == CONTENT_TYPE_PLAIN_0_0_4
    assert value(before, "camg_capacity", **env) == 4
    assert value(before, "camg_episodes_live", **env) == 0

    client = Client(service.url)
    done = client.create(task_id=f"{SECRET}-ok")["episode_id"]
    client.step(done, {"operation": "guess", "value": 3})
    assert client.step(done, {"operation": "guess", "value": 7})["reward"] == 1.0
    graded_badly = client.create(task_id=f"{SECRET}-grader")["episode_id"]
    assert client.step(graded_badly, {"operation": "finish"})["failure_class"] == "grader_error"
    with pytest.raises(ServiceError) as failed:
        client.create(task_id=f"{SECRET}-reset")
    assert failed.value.status == 503
    closed = client.create(task_id=f"{SECRET}-open")["episode_id"]
    client.step(closed, {"operation": "guess", "value": 1})
    _, live = scrape(service.url)
    assert value(live, "camg_episodes_live", **env) == 1
    client.close(closed)
    reaped = client.create(task_id=f"{SECRET}-ok")["episode_id"]
    deadline = time.monotonic() + 10
    # Polled through the listing, which renews no lease (GET of one episode would).
    while any(e["episode_id"] == reaped for e in client.list()["episodes"]):
        assert time.monotonic() < deadline, "the reaper did not close the idle episode"
        time.sleep(0.2)

    _, after = scrape(service.url)
    started = lambda kind: value(after, "camg_episodes_started_total", task_kind=kind, **env)  # noqa: E731
    assert started("arith") == 3 and started("logic") == 2

    def ended(kind, outcome, failure_class="none"):
        return value(after, "camg_episodes_ended_total", task_kind=kind, outcome=outcome,
                     failure_class=failure_class, integrity="none", **env)
    assert ended("arith", "done") == 1
    assert ended("arith", "done", "grader_error") == 1
    assert ended("logic", "done", "sandbox_died") == 1
    assert ended("logic", "closed") == 1
    assert ended("arith", "reaped", "timeout") == 1
    assert sum(v for (name, _), v in after.items() if name == "camg_episodes_ended_total") == 5
    assert value(after, "camg_episodes_live", **env) == 0

    count = lambda name: value(after, f"{name}_count", **env)  # noqa: E731
    assert count("camg_reset_seconds") == 4  # the failed reset is not a reset's duration
    assert count("camg_step_seconds") == 4
    assert count("camg_grade_seconds") == 2
    assert value(after, "camg_step_seconds_bucket", le="+Inf", **env) == 4
    assert 0 < value(after, "camg_step_seconds_sum", **env) < 5
    # The counter environment has no helper and no judge: no such series.
    assert not any(name == "camg_helper_up" for name, _ in after)
    for (name, labels), _ in after.items():
        assert not any(SECRET in v for _, v in labels), (name, labels)


def test_admission_queue_length(tmp_path):
    import threading

    config = configure_counter(tmp_path, capacity=1, limits={"idle_ttl_s": 60.0})
    proc = ServiceProcess(config).wait_ready()
    try:
        env = {"environment": "counter"}
        client = Client(proc.url)
        _, idle = scrape(proc.url)
        assert value(idle, "camg_admission_queued", **env) == 0
        assert value(idle, "camg_admission_queue_bound", **env) == 4  # 4 x capacity 1
        first = client.create()["episode_id"]
        admitted = []
        # a client of its own: one Client is one connection
        waiter = threading.Thread(target=lambda: admitted.append(Client(proc.url).create(wait=30)))
        waiter.start()
        deadline = time.monotonic() + 10
        while value(scrape(proc.url)[1], "camg_admission_queued", **env) != 1:
            assert time.monotonic() < deadline, "the waiting create never showed in the line"
            time.sleep(0.05)
        client.close(first)
        waiter.join(10)
        assert admitted and value(scrape(proc.url)[1], "camg_admission_queued", **env) == 0
        client.close(admitted[0]["episode_id"])
    finally:
        proc.stop()


def test_switched_off_is_a_404(tmp_path):
    config = configure_counter(tmp_path, limits={"idle_ttl_s": 30.0})
    proc = ServiceProcess(config, env={metrics.SWITCH: "off"}).wait_ready()
    try:
        with pytest.raises(urllib.error.HTTPError) as off:
            scrape(proc.url)
        assert off.value.code == 404
        client = Client(proc.url)  # episodes run as before
        eid = client.create()["episode_id"]
        assert client.step(eid, {"operation": "finish"})["done"] is True
    finally:
        proc.stop()


def test_registries_are_per_service():
    a, b = metrics.Metrics("counter"), metrics.Metrics("counter")
    a.episode_started("arith")
    assert 'task_kind="arith"' not in b.exposition().decode()
    assert 'task_kind="arith"' in a.exposition().decode()


def test_helper_up_follows_health():
    class Env:
        helper = None
    env, reasons = Env(), ["helper: unreachable"]
    up = metrics.helper_up(env, lambda: (not reasons, reasons))
    assert up() is False  # not connected yet
    env.helper = object()
    assert up() is False  # connected, but /health names a helper problem
    reasons.clear()
    assert up() is True
    m = metrics.Metrics("coding")
    m.watch(live=lambda: 0, capacity=2, helper_up=up)
    assert 'camg_helper_up{environment="coding"} 1.0' in m.exposition().decode()


def test_judge_requests_retries_and_failures():
    m = metrics.Metrics("general")
    with FakeJudge() as fake:
        judge = make(fake, attempts=2)

        class Env:
            pass
        env = Env()
        env.judge = judge
        metrics.observe_judge(env, m)
        fake.script(Reply(status=500), Reply(text='{"score": 1}'))
        assert judge.ask("q").attempts == 2
        fake.script(Reply(status=500), Reply(status=500))
        with pytest.raises(JudgeError):
            judge.ask("q")
        judge.close()
    exposed = m.exposition().decode()
    assert 'camg_judge_requests_total{environment="general",result="ok"} 1.0' in exposed
    assert 'camg_judge_requests_total{environment="general",result="error"} 1.0' in exposed
    assert 'camg_judge_retries_total{environment="general"} 2.0' in exposed
    assert 'camg_judge_seconds_count{environment="general"} 2.0' in exposed


def documented() -> dict[str, tuple[str, set[str]]]:
    text = (REPO / "packaging" / "README.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(camg_\w+)` \| (\w+) \| ([\w, -]+) \|$", section, re.M)
    assert rows, "packaging/README.md has no metrics table"
    # "-": a series without labels (the helper's own)
    return {name: (kind, {label.strip() for label in labels.split(",")} - {"-"})
            for name, kind, labels in rows}


def defined() -> dict[str, tuple[str, set[str]]]:
    """Every series camg/metrics.py defines: a service's and the helper's."""
    found = {}
    for metric in [*vars(metrics.Metrics("x")).values(), *vars(metrics.HelperMetrics()).values()]:
        if isinstance(metric, MetricWrapperBase) and not metric._labelvalues:
            name = metric._name + ("_total" if metric._type == "counter" else "")
            found[name] = (metric._type, set(metric._labelnames))
    return found


def test_readme_table_lists_every_metric_and_label():
    code, doc = defined(), documented()
    assert len(code) == 16 + 7
    assert code == doc


def test_a_lost_label_fails_the_table_check():
    # The check above can fail: a table row without a label the code has.
    doc = documented()
    kind, labels = doc["camg_episodes_ended_total"]
    doc["camg_episodes_ended_total"] = (kind, labels - {"integrity"})
    assert defined() != doc


def test_openmetrics_when_the_scraper_asks(service):
    request = urllib.request.Request(f"{service.url}/metrics",
                                     headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.read().decode().rstrip().endswith("# EOF")
