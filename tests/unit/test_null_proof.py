"""A null is a claim the service proves (camg.episodes.null_proof), through a real
camg.serve process running the counter environment: a failed step or grade
whose control succeeds is the submission's doing (0.0, integrity
obstructed); one whose control fails too, or that has no control, stays
null and degrades the service's health."""

import urllib.request

from camg_client import Client


def _tasks():
    return [
        {"task_id": "obstructed-grade", "data": {"target": 1, "grade_fails": True,
                                                 "control": "passes"}},
        {"task_id": "broken-grader", "data": {"target": 1, "grade_fails": True,
                                              "control": "fails"}},
        {"task_id": "crash-obstructed", "data": {"target": 1, "control": "passes"}},
        {"task_id": "plain", "data": {"target": 1}},
    ]


def _metric(url: str, result: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("camg_null_controls_total{") and f'result="{result}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_failure_whose_control_succeeds_is_the_submissions(counter_service):
    svc = counter_service(tasks=_tasks())
    client = Client(svc.url)
    eid = client.create(task_id="obstructed-grade")["episode_id"]
    result = client.step(eid, {"operation": "guess", "value": 1})
    assert result["done"] and result["reward"] == 0.0 and result["failure_class"] is None
    crashed = client.create(task_id="crash-obstructed")["episode_id"]
    result = client.step(crashed, {"operation": "crash"})
    assert result["reward"] == 0.0 and result["failure_class"] is None
    records = {o["episode_id"]: o for o in svc.outcomes()}
    for episode, phase in ((eid, "grade"), (crashed, "step")):
        record = records[episode]
        assert record["integrity"] == "obstructed" and record["grade_reason"] == "obstructed"
        assert record["integrity_evidence"][0].startswith(f"{phase} failed (")
        assert f"a fresh {phase} of the reference guess succeeded" in record["integrity_evidence"][1]
        assert record["reward"] == 0.0 and record["failure_class"] is None
        assert record["timings"]["control_s"] >= 0
    assert _metric(svc.url, "obstructed") == 2
    # Disproved nulls are the agent's business, not the operator's.
    assert client.health()["status"] == "healthy" and client.health()["serving"] is True


def test_a_null_stands_only_when_its_control_fails_or_there_is_none(counter_service):
    svc = counter_service(tasks=_tasks())
    client = Client(svc.url)
    assert client.health()["status"] == "healthy"
    eid = client.create(task_id="broken-grader")["episode_id"]
    result = client.step(eid, {"operation": "guess", "value": 1})
    assert result["reward"] is None and result["failure_class"] == "grader_error"
    plain = client.create(task_id="plain")["episode_id"]
    assert client.step(plain, {"operation": "boom"})["failure_class"] == "infra"
    records = {o["episode_id"]: o for o in svc.outcomes()}
    assert records[eid].get("integrity") != "obstructed" and records[eid]["reward"] is None
    assert records[plain]["reward"] is None
    assert _metric(svc.url, "confirmed") == 1 and _metric(svc.url, "unproven") == 1
    health = client.health()
    assert health["status"] != "healthy"
    assert any("no control disproved it (1 grader_error, 1 infra)" in r
               for r in health["reasons"]), health
    # Degraded for the operator, yet it takes episodes (what a kill storm
    # waits for after a kill): those nulls are history, not a broken service.
    assert health["serving"] is True
    again = client.create(task_id="plain")["episode_id"]
    assert client.step(again, {"operation": "guess", "value": 1})["done"]
