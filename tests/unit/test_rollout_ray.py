"""``python -m camg_client --ray`` on a local multi-node Ray cluster.

One machine stands in for three hosts: a Ray head and two worker nodes, each
started with the ``camg`` resource and ``CAMG_ROUTES`` naming its own camg
instance (a real ``camg.serve`` of the counter environment on its own
loopback port). The proof that every node drives only its own services comes
from each instance's own records — outcome records and trajectories — not
from what the actors report.

Ray is a trainer-side package, not in the services' lock: the cluster and
the rollout run in a venv of the client's own ``ray`` extra (its pin in
clients/python/pyproject.toml, built once under $CAMG_CACHE by
tests/support/framework_venvs.py), driven by tests/support/ray_nodes.py. A
venv that cannot be built fails the test: nothing here is skipped.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from camg_client import Client
from camg_client.rollout_ray import RayRolloutError, check_same_tasks, is_loopback

from tests.support.framework_venvs import framework_venv
from tests.support.services import REPO

NODES = ("head", "worker1", "worker2")
EPISODES = 15
DRIVER = REPO / "tests" / "support" / "ray_nodes.py"


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def records(service) -> tuple[set[str], set[str]]:
    """The episode ids an instance itself recorded: outcomes and trajectories."""
    outcomes = {r["episode_id"] for r in service.outcomes()}
    trajectories = {p.stem for p in
                    (Path(service.config["state_dir"]) / "trajectories").glob("*.jsonl")}
    return outcomes, trajectories


def test_episodes_spread_over_every_node_and_stay_on_its_own_services(
        counter_service, cache_root, tmp_path):
    python = framework_venv(cache_root, "ray")
    services = [counter_service(references=True, capacity=4, wait=False) for _ in NODES]
    for service in services:
        service.wait_ready()
    routes = [str(s.config_path.parent / "routes.json") for s in services]
    out = tmp_path / "run.jsonl"
    report_path = tmp_path / "cluster.json"
    started = time.monotonic()
    proc = subprocess.run(
        [str(python), str(DRIVER), str(report_path), *routes, "--",
         # No such file on any node: each node's CAMG_ROUTES must win.
         "--routes", str(tmp_path / "absent" / "routes.json"), "--env", "counter",
         "--policy", "oracle", "--episodes", str(EPISODES), "--concurrency", "2",
         "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=420,
        # the client from this checkout; nothing of the services' library
        env={**os.environ, "PYTHONPATH": str(REPO / "clients" / "python")})
    assert proc.returncode == 0 and report_path.exists(), proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(f"cluster and rollout over 3 nodes: {time.monotonic() - started:.1f} s "
          f"(rollout {report.get('wall', 0):.1f} s)\n{report.get('stdout', '')}")
    # The cluster's processes all carried the marker and all went at its shutdown.
    assert report["unmarked_node_processes"] == [] and report["outlived_shutdown"] == [], report
    # Every Ray listener of the three "hosts" is on loopback, before and after.
    assert report["listening_before"] and all(map(on_loopback, report["listening_before"]))
    assert all(map(on_loopback, report["listening_after"])), report["listening_after"]
    assert report["returncode"] == 0, report["stderr"] + report["stdout"]
    body = dict(line.split(None, 1) for line in report["stdout"].splitlines() if line.strip())
    assert body["episodes"] == str(EPISODES) and body["rewarded"] == str(EPISODES)
    assert body["reward_min"] == "1" and body["errors"] == "0" and body["nodes"] == "3"

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == EPISODES and all(line["reward"] == 1.0 for line in lines)
    by_node: dict[str, set[str]] = {}
    for line in lines:
        by_node.setdefault(line["node"], set()).add(line["episode_id"])
    node_ids = [n["node_id"] for n in report["nodes"]]
    # Episodes ran on every node ...
    assert set(by_node) == set(node_ids), by_node
    for node_id, service in zip(node_ids, services):
        mine = by_node[node_id]
        assert mine
        # ... and each instance saw exactly its own node's episodes, by its own records.
        outcomes, trajectories = records(service)
        assert outcomes == mine, (node_id, outcomes ^ mine)
        assert trajectories == mine
    assert all(Client(s.url).list()["active"] == 0 for s in services)


def test_only_loopback_routes_are_a_nodes_own():
    assert is_loopback("http://127.0.0.1:65134") and is_loopback("http://localhost:1")
    assert is_loopback("http://[::1]:65134") and is_loopback("http://127.1.2.3:9")
    assert is_loopback("http://[::ffff:127.0.0.1]:1")
    assert not is_loopback("http://192.0.2.1:65134") and not is_loopback("http://camg-node2:1")


def test_nodes_serving_different_task_sets_are_refused():
    same = [{"host": "a", "node": "1" * 56, "task_selection_hash": "x"},
            {"host": "b", "node": "2" * 56, "task_selection_hash": "x"}]
    check_same_tasks(same)
    with pytest.raises(RayRolloutError, match="different task selections.*b/22222222 y"):
        check_same_tasks([same[0], {**same[1], "task_selection_hash": "y"}])


def test_ray_stays_out_of_the_services_and_the_plain_rollout():
    # ray is a trainer-side extra (the client's [ray]), not in the services' lock.
    probe = ("import sys; import camg.serve, camg_client.cli, camg_client.rollout_ray; "
             "assert 'ray' not in sys.modules, 'imported ray'")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lock = (Path(REPO) / "requirements.lock").read_text().lower()
    assert "\nray==" not in lock


class _Lost(Exception):
    """Stands in for ray.exceptions.RayActorError."""


class _FakeRay:
    """Just what ``_drive`` uses of ray: refs resolve in submission order."""

    class exceptions:
        RayError = _Lost

    @staticmethod
    def wait(refs, num_returns=1):
        return refs[:1], refs[1:]

    @staticmethod
    def get(ref):
        if isinstance(ref.value, Exception):
            raise ref.value
        return ref.value


class _Ref:
    def __init__(self, value) -> None:
        self.value = value


class _Actor:
    def __init__(self, name: str, lives: int | None = None) -> None:
        self.name, self.lives, self.seeds = name, lives, []
        self.episode = self

    def remote(self, task_id, seed, variant=None):
        self.seeds.append(seed)
        if self.lives is not None and len(self.seeds) > self.lives:
            return _Ref(_Lost("the actor died"))
        return _Ref({"episode_id": f"{self.name}-{seed}", "task_id": "t", "reward": 1.0,
                     "failure_class": None, "steps": 1, "reset_s": 0.001, "step_s": [0.002],
                     "error": None})


def test_a_lost_node_fails_only_its_episodes_in_flight_and_the_rest_move_on(tmp_path):
    import io

    from camg_client.rollout_ray import _drive

    actors = [_Actor("a"), _Actor("b", lives=1)]
    infos = [{"host": "h", "node": "a" * 56}, {"host": "h", "node": "b" * 56}]
    out = io.StringIO()
    body = _drive(_FakeRay, actors, infos, 10, 2, None, out, progress=False)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert body["episodes"] == 10 and len(lines) == 10
    failed = [line for line in lines if line["error"]]
    # b's first episode counted and it got another before its loss showed; the two it
    # had in flight then are errors naming it; every later episode ran on a.
    assert [line["node"] for line in failed] == ["b" * 56] * 2
    assert all("h/bbbbbbbb" in line["error"] for line in failed)
    assert body["errors"] == 2 and body["rewarded"] == 8
    assert actors[1].seeds == [2, 3, 6] and len(actors[0].seeds) == 7
    assert sorted(actors[0].seeds + actors[1].seeds) == list(range(10))
    assert body["episodes_by_node"] == {"h/aaaaaaaa": 7, "h/bbbbbbbb": 3}


def test_episodes_no_node_is_left_for_are_reported_not_dropped():
    from camg_client.rollout_ray import _drive

    actors = [_Actor("a", lives=0), _Actor("b", lives=0)]
    infos = [{"host": "h", "node": "a" * 56}, {"host": "h", "node": "b" * 56}]
    body = _drive(_FakeRay, actors, infos, 10, 2, None, None, progress=False)
    assert body["episodes"] == 10 and body["errors"] == 10 and body["rewarded"] == 0
    # a's loss moved its next work to b before b's showed: 6 were sent, 4 never were
    assert len(actors[0].seeds) + len(actors[1].seeds) == 6


def test_an_unreachable_cluster_is_said_at_once():
    from tests.support.services import free_port

    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "camg_client", "--ray", f"127.0.0.1:{free_port()}", "--routes",
         "routes.json", "--env", "counter", "--policy", "noop", "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot reach the Ray cluster" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30
