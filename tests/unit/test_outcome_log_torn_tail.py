"""A service killed (kill -9) inside the write of an outcome record leaves a
torn last line: a write to a regular file that a fatal signal interrupts
returns short at a page boundary. The record was never acknowledged (the
reply waits for the fsync), but the restarted service must not append the
next, acknowledged record onto that fragment."""

from __future__ import annotations

import json

from camg.outcomes import OutcomeLog


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
