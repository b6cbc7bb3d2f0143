"""POST /episodes/{id}/regrade and python -m camg_client --regrade against a real
camg.serve process (the framework's counter environment), plus the
submission store and the manager's refusals in-process."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from camg.environment import Submission, Task
from camg.errors import NoSubmission, RegradeUnsupported
from camg.episodes.outcomes import OutcomeLog
from camg.episodes.submissions import SubmissionStore
from camg_client import AsyncClient, Client
from camg_client import client as client_mod
from tests.support.services import REPO, ServiceProcess, configure_counter, counter_tasks

GRADER = "counter-exact-match/1"


@pytest.fixture(scope="module")
def regrading(tmp_path_factory):
    """One service for the module (the restart test, last, replaces it)."""
    tasks = counter_tasks() + [{"task_id": "broken", "data": {"target": 5, "grade_fails": True}}]
    config = configure_counter(tmp_path_factory.mktemp("regrade"), tasks=tasks, references=True,
                               settings={"regrade_sleep": 0.3}, limits={"grade_timeout_s": 5})
    service = ServiceProcess(config).wait_ready()
    yield service
    service.stop(signal.SIGINT)


def by_status(svc, episode_id):
    records = [r for r in svc.outcomes() if r["episode_id"] == episode_id]
    return {r["status"]: r for r in records}, records


def test_regrade_gives_the_same_reward_and_keeps_both_records(regrading):
    client = Client(regrading.url)
    won = client.create(task_id="task-03")["episode_id"]
    client.step(won, {"operation": "guess", "value": 50})
    assert client.step(won, {"operation": "guess", "value": 14})["reward"] == 1.0
    lost = client.create(task_id="task-03")["episode_id"]
    assert client.step(lost, {"operation": "finish"})["reward"] == 0.0

    for eid, reward in ((won, 1.0), (lost, 0.0)):
        answer = client.regrade(eid)
        assert answer["reward"] == reward and answer["failure_class"] is None
        assert answer["status"] == "regraded" and answer["same_grader"] is True
        assert answer["grader_hash"] == GRADER
        assert answer["regrade_of"]["reward"] == reward
        assert answer["regrade_of"]["grader_hash"] == GRADER
        statuses, records = by_status(regrading, eid)
        assert len(records) == 2 and set(statuses) == {"done", "regraded"}
        original = statuses["done"]
        assert original["grader_hash"] == GRADER and original["reward"] == reward
        # the record names content-addressed bytes that are really stored
        ref = original["submission"]
        assert answer["submission"] == ref and ref["sha256"].startswith("sha256:")
        blob = Path(regrading.config["state_dir"]) / "submissions" / ref["sha256"][7:9] / ref["sha256"][7:]
        assert json.loads(blob.read_bytes()) == ([50, 14] if eid == won else [])
        assert statuses["regraded"]["regraded_guesses"] == ref["meta"]["guesses"]
    # a second regrade appends a third record, still against the original
    again = client.regrade(won)
    assert again["reward"] == 1.0 and again["regrade_of"]["reward"] == 1.0
    assert len(by_status(regrading, won)[1]) == 3


def test_refusals_are_typed_errors(regrading):
    client = Client(regrading.url)
    with pytest.raises(client_mod.NotFound) as info:
        client.regrade("no-such-episode")
    assert info.value.status == 404 and info.value.name == "episode_not_found"
    running = client.create()["episode_id"]
    with pytest.raises(client_mod.EpisodeRunning) as info:
        client.regrade(running)
    assert info.value.status == 409 and info.value.name == "episode_running"
    # closed by the trainer before it ended: it never submitted
    client.close(running)
    with pytest.raises(client_mod.NoSubmission) as info:
        client.regrade(running)
    assert info.value.status == 409
    with pytest.raises(client_mod.BadRequest):
        client.request("POST", f"/episodes/{running}/regrade", {"grader": "other"})
    assert "regrade_response" in client.schema()


def test_one_regrade_at_a_time_per_episode(regrading):
    client = Client(regrading.url)
    eid = client.create(task_id="task-00")["episode_id"]
    client.step(eid, {"operation": "finish"})

    async def both():
        async with AsyncClient(regrading.url) as aclient:
            return await asyncio.gather(aclient.regrade(eid), aclient.regrade(eid),
                                        return_exceptions=True)

    results = asyncio.run(both())
    busy = [r for r in results if isinstance(r, client_mod.ServiceError)]
    done = [r for r in results if isinstance(r, dict)]
    assert len(done) == 1 and len(busy) == 1 and busy[0].name == "episode_busy"
    assert len(by_status(regrading, eid)[1]) == 2


def test_infrastructure_failure_is_recorded_as_null_with_its_class(regrading):
    client = Client(regrading.url)
    eid = client.create(task_id="broken")["episode_id"]
    first = client.step(eid, {"operation": "guess", "value": 5})
    assert first["reward"] is None and first["failure_class"] == "grader_error"
    answer = client.regrade(eid)   # the submission was kept although grading failed
    assert answer["reward"] is None and answer["failure_class"] == "grader_error"
    assert answer["regrade_of"]["failure_class"] == "grader_error"
    assert by_status(regrading, eid)[0]["regraded"]["reward"] is None


def test_rollout_regrades_a_run(regrading, tmp_path):
    routes = regrading.config_path.parent / "routes.json"
    run = tmp_path / "run.jsonl"
    base = [sys.executable, "-m", "camg_client", "--routes", str(routes), "--env", "counter",
            "--no-progress"]
    first = subprocess.run(base + ["--policy", "oracle", "--episodes", "3", "--concurrency", "3",
                                   "--out", str(run)], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr + first.stdout
    out = tmp_path / "regrade.jsonl"
    second = subprocess.run(base + ["--regrade", str(run), "--concurrency", "3", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr + second.stdout
    body = dict(line.split(None, 1) for line in second.stdout.splitlines() if line.strip())
    assert body["episodes"] == "3" and body["same_reward"] == "3" and body["errors"] == "0"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(x["reward"] == x["run_reward"] == x["recorded_reward"] == 1.0 for x in lines)
    assert all(x["same_grader"] for x in lines)


def test_an_environment_without_regrade_answers_501(tmp_path):
    from camg.episodes.manager import EpisodeManager
    from camg.environment import ServiceContext
    from camg.config.service_config import Limits
    from tests.support.counter_env import PlainCounterEnvironment

    env = PlainCounterEnvironment(ServiceContext("counter", str(tmp_path), {}),
                                  [Task("t", {"target": 1})])
    manager = EpisodeManager(env, capacity=1, limits=Limits(), config_hash="h",
                             outcomes=OutcomeLog(tmp_path))
    with pytest.raises(RegradeUnsupported) as info:
        asyncio.run(manager.regrade("anything"))
    assert info.value.http_status == 501 and info.value.name == "regrade_unsupported"
    manager.threads.shutdown()
    # over HTTP the same name arrives as the client's typed error
    assert client_mod.ERROR_CLASSES["regrade_unsupported"] is client_mod.RegradeUnsupported


def test_submission_store_is_content_addressed_and_bounded(tmp_path):
    store = SubmissionStore(tmp_path, max_bytes=1000)
    a = store.put(Submission(b"x" * 400, {"k": 1}))
    assert store.put(Submission(b"x" * 400, {"k": 2}))["sha256"] == a["sha256"]  # stored once
    assert store.get(a) == Submission(b"x" * 400, {"k": 1})
    empty = store.put(Submission(b"", {"purchase": {"asin": "B0"}}))
    assert empty["sha256"] is None and store.get(empty).meta == {"purchase": {"asin": "B0"}}
    b = store.put(Submission(b"y" * 400))
    c = store.put(Submission(b"z" * 400))   # over 1000 bytes: the oldest (a) goes
    with pytest.raises(NoSubmission, match="evicted"):
        store.get(a)
    assert store.get(b).data == b"y" * 400 and store.get(c).data == b"z" * 400
    path = tmp_path / "submissions" / c["sha256"][7:9] / c["sha256"][7:]
    path.write_bytes(b"tampered")
    with pytest.raises(NoSubmission, match="damaged"):
        store.get(c)
    with pytest.raises(ValueError):
        store.put(Submission(b"", {"big": "m" * (70 << 10)}))
    # a restarted store counts what is already there, and drops unfinished writes
    unfinished = path.parent / ".in-killed"
    unfinished.write_bytes(b"half")
    assert SubmissionStore(tmp_path, max_bytes=1000)._total == 400 + len(b"tampered")
    assert not unfinished.exists()


def test_outcome_log_finds_the_episodes_own_record(tmp_path):
    log = OutcomeLog(tmp_path)
    log.append({"episode_id": "e1", "reward": 1.0})
    log.append({"episode_id": "e10", "reward": 0.5})
    log.append({"episode_id": "e1", "reward": 0.0, "regrade_of": {"reward": 1.0}})
    assert log.find("e1") == {"episode_id": "e1", "reward": 1.0}
    assert log.find("e10")["reward"] == 0.5 and log.find("e2") is None
    log.close()


def test_regrade_after_a_restart_finds_the_episode_in_the_log(regrading):
    client = Client(regrading.url)
    eid = client.create(task_id="task-00")["episode_id"]
    client.step(eid, {"operation": "guess", "value": 35})
    regrading.stop(signal.SIGINT)
    restarted = ServiceProcess(regrading.config_path).wait_ready()
    try:
        answer = Client(restarted.url).regrade(eid)
        assert answer["reward"] == 1.0 and answer["same_grader"] is True
    finally:
        restarted.stop(signal.SIGINT)
