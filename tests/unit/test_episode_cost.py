"""Per-episode cost (issue 27 d2): the helper's usage verbs on the wire, the
reader over cgroup-v1 files, the record's cost field, the rollout summary."""

from __future__ import annotations

import os
import time

import pytest

from camg import helper_wire as wire
from camg.episodes import cost
from camg_client import Client
from camg_client.rollout import Result, summary
from helper import usage, verbs
from helper.sandbox_table import Peer


@pytest.mark.parametrize("verb, good, field", [
    ("SandboxUsage", {"sandbox_id": "abc"}, "sandbox_id"),
    ("ContainerUsage", {"container_id": "abc"}, "container_id"),
])
def test_usage_verbs_are_strict_rows_of_the_closed_table(verb, good, field):
    name = wire.PREFIX + verb
    assert name in verbs.VERBS and verbs.VERBS[name].params is wire.PARAMS[name]
    assert wire.parse(wire.PARAMS[name], good, "params", verbs.BadParams) == wire.PARAMS[name](**good)
    ctx = verbs.Context(registry=None, run_probes=lambda: {})
    peer = Peer(0, 0, 1, "t")
    for bad in ({}, {**good, "bogus": 1}, {field: 7}):
        with pytest.raises(wire.WireError) as info:
            verbs.dispatch(ctx, peer, name, bad, b"")
        assert info.value.name == "bad_request", bad
    with pytest.raises(wire.WireError, match="takes no blob"):
        verbs.dispatch(ctx, peer, name, good, b"x")
    with pytest.raises(TypeError):
        wire.request(verb, wire.NoParams(), "o")
    assert wire.request(verb, wire.PARAMS[name](**good), "o")["params"] == good


def _cgroups(root, *, cpuacct_ns=None, shmem=0):
    cg = {c: str(root / c) for c in ("cpu", "memory", "pids", "freezer")}
    for path in cg.values():
        os.makedirs(path)
    if cpuacct_ns is not None:
        (root / "cpu" / "cpuacct.usage").write_text(f"{cpuacct_ns}\n")
    (root / "memory" / "memory.max_usage_in_bytes").write_text("123456\n")
    (root / "memory" / "memory.stat").write_text(f"cache 5\nshmem {shmem}\ntotal_shmem {shmem}\n")
    (root / "freezer" / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return cg


def test_sandbox_usage_reads_cpuacct_peak_memory_and_the_tmpfs_upper(tmp_path):
    cg = _cgroups(tmp_path, cpuacct_ns=2_500_000_000, shmem=3 << 20)
    assert usage.sandbox_usage(cg, "") == {
        "cpu_s": 2.5, "memory_peak_bytes": 123456, "disk_written_bytes": 3 << 20}
    (tmp_path / "pids" / "pids.peak").write_text("9\n")
    assert usage.sandbox_usage(cg, "")["pids_peak"] == 9


def test_without_cpuacct_the_members_cpu_comes_from_proc(tmp_path):
    cg = _cgroups(tmp_path)
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    # this process is the only member: at least the 0.2 s it just burned
    assert usage.cpu_seconds(cg) >= 0.15
    (tmp_path / "freezer" / "cgroup.procs").write_text("")
    assert usage.cpu_seconds(cg) == 0


def test_a_disk_upper_counts_the_blocks_written_under_upper(tmp_path):
    cg = _cgroups(tmp_path)
    upper = tmp_path / "up"
    (upper / "upper" / "a" / "b").mkdir(parents=True)
    (upper / "work").mkdir()
    (upper / "upper" / "a" / "b" / "f").write_bytes(os.urandom(1 << 20))
    (upper / "work" / "ignored").write_bytes(b"x" * 65536)
    with open(upper / "upper" / "sparse", "wb") as f:
        f.truncate(1 << 30)  # holds no blocks
    written = usage.sandbox_usage(cg, str(upper))["disk_written_bytes"]
    assert 1 << 20 <= written < (1 << 20) + 65536


def test_the_record_cost_keeps_measures_drops_the_unknown_and_adds_phases():
    phases = {"reset_s": 0.1234567, "steps_s": 1, "grade_s": 0.0, "wall_s": 2.0}
    got = cost.episode_cost({"cpu_s": 1.5, "memory_peak_bytes": 9, "disk_written_bytes": None,
                             "reward": 1.0, "judge_tokens": {"prompt_tokens": 3}}, phases)
    assert got == {"cpu_s": 1.5, "memory_peak_bytes": 9, "judge_tokens": {"prompt_tokens": 3},
                   "phases": {"reset_s": 0.123457, "steps_s": 1.0, "grade_s": 0.0, "wall_s": 2.0}}
    assert cost.episode_cost("junk", {}) == {"phases": {}}
    total: dict = {}
    for reply_usage in ({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                        None, {"prompt_tokens": -1, "completion_tokens": True},
                        {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}):
        cost.add_tokens(total, reply_usage)
    assert total == {"prompt_tokens": 15, "completion_tokens": 3, "total_tokens": 18}


def test_rollout_summary_means_cost_over_the_episodes_that_measured_it():
    def result(c):
        return Result("e", "t", 1.0, None, 1, 0.1, [0.2], cost=c)
    results = [result({"cpu_s": 1.0, "memory_peak_bytes": 100, "phases": {}}),
               result({"cpu_s": 3.0, "memory_peak_bytes": 300, "disk_written_bytes": 8}),
               result({"phases": {}}), result(None)]
    body = summary(results, 1.0)
    assert body["cpu_s_mean"] == 2.0 and body["memory_peak_bytes_mean"] == 200
    assert body["disk_written_bytes_mean"] == 8
    assert results[0].line()["cost"] == {"cpu_s": 1.0, "memory_peak_bytes": 100, "phases": {}}
    assert summary([result(None)], 1.0)["cpu_s_mean"] is None


def test_the_record_the_reply_and_the_state_carry_the_same_cost(shared_counter_service):
    svc = shared_counter_service
    client = Client(svc.url)
    eid = client.create(task_id="task-00")["episode_id"]
    final = client.step(eid, {"operation": "guess", "value": 35})
    [record] = [r for r in svc.outcomes() if r["episode_id"] == eid]
    phases = record["cost"]["phases"]
    assert set(phases) == {"reset_s", "steps_s", "grade_s", "wall_s"}
    assert phases["wall_s"] >= phases["reset_s"] + phases["steps_s"] > 0
    # the counter measures nothing: no made-up cpu or memory
    assert "cpu_s" not in record["cost"] and "memory_peak_bytes" not in record["cost"]
    assert final["cost"] == record["cost"] == client.get(eid)["cost"]
    closed = client.create(task_id="task-01")["episode_id"]
    assert "cost" not in client.get(closed)
    state = client.close(closed)
    [record] = [r for r in svc.outcomes() if r["episode_id"] == closed]
    assert state["cost"] == record["cost"] and record["cost"]["phases"]["steps_s"] == 0
