"""What a killed service leaves in its outcome log, and what its next start
does about it.

A service killed (kill -9) inside the write of an outcome record leaves a
torn last line: a write to a regular file that a fatal signal interrupts
returns short at a page boundary. The record was never acknowledged (the
reply waits for the fsync), but the restarted service must not append the
next, acknowledged record onto that fragment. Episodes the killed service
had running get their record (reward null, infra) from the next start.
"""

from __future__ import annotations

import json

from camg.episodes.outcomes import OutcomeLog


def test_a_torn_tail_is_cut_before_the_next_record(tmp_path):
    first = OutcomeLog(tmp_path)
    first.append({"episode_id": "a", "reward": 1.0})
    first.close()
    with open(tmp_path / "outcomes.jsonl", "ab") as f:
        f.write(b'{"episode_id":"b","reason":"' + b"x" * 5000)  # killed mid-record

    restarted = OutcomeLog(tmp_path)
    restarted.append({"episode_id": "c", "reward": 0.0})
    restarted.close()

    lines = (tmp_path / "outcomes.jsonl").read_text().splitlines()
    assert [json.loads(line)["episode_id"] for line in lines] == ["a", "c"]


def test_an_intact_log_is_left_as_it_is(tmp_path):
    log = OutcomeLog(tmp_path)
    log.append({"episode_id": "a", "reward": 1.0})
    log.close()
    before = (tmp_path / "outcomes.jsonl").read_bytes()
    OutcomeLog(tmp_path).close()
    assert (tmp_path / "outcomes.jsonl").read_bytes() == before
    OutcomeLog(tmp_path / "fresh").close()
    assert (tmp_path / "fresh" / "outcomes.jsonl").read_bytes() == b""


def test_episodes_a_killed_service_left_running_are_recorded_masked_by_the_next_start(tmp_path):
    killed = OutcomeLog(tmp_path)
    killed.trajectory("done", {"event": "reset", "task_id": "t0", "seed": None})
    killed.trajectory("done", {"event": "end", "reward": 1.0})
    killed.finish_trajectory("done")
    killed.append({"episode_id": "done", "reward": 1.0, "failure_class": None})
    killed.trajectory("running", {"event": "reset", "task_id": "t1", "seed": 7})
    killed.trajectory("running", {"event": "step", "step": 1})
    # kill -9 here: no close, no record for "running".
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == \
        ["done.jsonl", "running.jsonl", "running.open"]

    restarted = OutcomeLog(tmp_path)
    assert restarted.recover("counter", "h1") == ["running"]
    assert restarted.recover("counter", "h1") == []  # once
    restarted.close()
    records = {r["episode_id"]: r for r in OutcomeLog(tmp_path).read()}
    assert records["done"]["reward"] == 1.0
    masked = records["running"]
    assert masked["reward"] is None and masked["failure_class"] == "infra"
    assert (masked["task_id"], masked["seed"], masked["steps"], masked["recovered"]) == \
        ("t1", 7, 1, True)
    assert masked["environment"] == "counter" and masked["config_hash"] == "h1"
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == \
        ["done.jsonl", "running.jsonl"]
    last = (tmp_path / "trajectories" / "running.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["event"] == "end"


def test_a_record_written_just_before_the_kill_is_not_recorded_twice(tmp_path):
    log = OutcomeLog(tmp_path)
    log.trajectory("e", {"event": "reset", "task_id": "t", "seed": None})
    log.finish_trajectory("e")
    log.append({"episode_id": "e", "reward": 0.0, "failure_class": None})
    (tmp_path / "trajectories" / "e.open").touch()  # killed before the unlink
    assert OutcomeLog(tmp_path).recover("counter", "h") == []
    assert [r["reward"] for r in OutcomeLog(tmp_path).read()] == [0.0]
    assert not (tmp_path / "trajectories" / "e.open").exists()
