"""camg status's episodes per minute and failure classes (camg.serving.activity):
rates from the services' own /metrics counters between two samples, kept
in a state file between runs; over a real camg.serve of the counter env."""

from __future__ import annotations

import json
import time

import pytest

from camg import status
from camg.serving import activity
from camg_client import Client
from tests.support.services import ServiceProcess, configure_counter


def sample(t, started, **ended):
    return {"t": t, "started": started,
            "ended": {k.replace("__", "/"): v for k, v in ended.items()}}


def test_rates_outcomes_and_failure_classes_between_two_samples():
    earlier = sample(100.0, 4, done__none=3)
    now = sample(160.0, 10, done__none=6, done__grader_error=2, reaped__timeout=1)
    got = activity.activity(earlier, now)
    assert got == {"window_s": 60.0, "ended_per_min": 6.0, "started_per_min": 6.0,
                   "outcomes": {"done": 5, "reaped": 1},
                   "failure_classes": {"grader_error": 2, "timeout": 1}}
    assert activity.describe(got) == "6/min ended over 60 s (grader_error 2, timeout 1)"


def test_a_restarted_worker_counts_from_zero_never_negative():
    # the worker restarted: its counters are below the earlier sample's
    got = activity.activity(sample(0.0, 50, done__none=40), sample(120.0, 2, done__none=1))
    assert got["ended_per_min"] == 0.5 and got["started_per_min"] == 1.0
    assert got["outcomes"] == {"done": 1}


def test_samples_older_than_the_window_are_dropped(tmp_path):
    state = tmp_path / "state.json"
    samples = activity.Samples(state)
    samples.add("shop@1", sample(0.0, 1))
    samples.add("shop@1", sample(1000.0, 2))  # the first is past WINDOW_S now
    samples.save()
    again = activity.Samples(state)
    assert [s["t"] for s in again.data["shop@1"]] == [1000.0]
    assert again.earliest("shop@1", 1000.5) is None  # nearer than MIN_SPAN_S: no window
    assert again.earliest("shop@1", 1200.0)["t"] == 1000.0
    assert state.stat().st_mode & 0o777 == 0o600


@pytest.fixture
def service(tmp_path):
    tasks = [{"task_id": "ok", "data": {"target": 3}},
             {"task_id": "bad-grader", "data": {"target": 4, "grade_fails": True}}]
    config = configure_counter(tmp_path, tasks=tasks, limits={"idle_ttl_s": 60})
    proc = ServiceProcess(config).wait_ready()
    yield proc
    proc.stop()


def report(etc, state, monkeypatch, capsys, sample_s=0.0) -> dict:
    monkeypatch.setattr(status, "systemd_running", lambda: False)
    monkeypatch.setattr(status, "leftovers", lambda *a: {})  # this machine's, not the test's
    status.main(["--etc", str(etc), "--json", "--state", str(state),
                 "--sample-s", str(sample_s)])
    return {r["environment"]: r for r in json.loads(capsys.readouterr().out)["environments"]}


def test_camg_status_shows_episodes_per_minute_and_failure_classes(service, tmp_path,
                                                                   monkeypatch, capsys):
    state = tmp_path / "status-samples.json"
    # first run, no earlier sample and no second scrape asked for: no rate made up
    assert report(tmp_path, state, monkeypatch, capsys)["counter"]["activity"] is None
    client = Client(service.url)
    for _ in range(2):
        eid = client.create(task_id="ok")["episode_id"]
        assert client.step(eid, {"operation": "guess", "value": 3})["reward"] == 1.0
    eid = client.create(task_id="bad-grader")["episode_id"]
    assert client.step(eid, {"operation": "finish"})["failure_class"] == "grader_error"
    client.close(client.create(task_id="ok")["episode_id"])
    time.sleep(activity.MIN_SPAN_S + 0.1)
    act = report(tmp_path, state, monkeypatch, capsys)["counter"]["activity"]
    assert act["outcomes"] == {"done": 3, "closed": 1}
    assert act["failure_classes"] == {"grader_error": 1}
    assert act["ended_per_min"] == pytest.approx(60 * 4 / act["window_s"], rel=0.01)
    assert act["started_per_min"] == pytest.approx(60 * 4 / act["window_s"], rel=0.01)
    # the table says the same in words, still since the oldest sample in the window
    monkeypatch.setattr(status, "systemd_running", lambda: False)
    status.main(["--etc", str(tmp_path), "--state", str(state), "--sample-s", "0"])
    out = capsys.readouterr().out
    assert "last minutes" in out and "/min ended over" in out and "(grader_error 1)" in out


def test_without_an_earlier_sample_it_scrapes_twice(service, tmp_path, monkeypatch, capsys):
    started = time.monotonic()
    act = report(tmp_path, tmp_path / "fresh.json", monkeypatch, capsys,
                 sample_s=0.5)["counter"]["activity"]
    assert time.monotonic() - started >= 0.5
    assert act["ended_per_min"] == 0 and 0.5 <= act["window_s"] < 5
