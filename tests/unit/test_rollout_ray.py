"""``python -m camg_client --ray`` on a local multi-node Ray cluster.

One machine stands in for three hosts: a Ray head and two worker nodes, each
started with the ``camg`` resource and ``CAMG_ROUTES`` naming its own camg
instance (a real ``camg.serve`` of the counter environment on its own
loopback port). The proof that every node drives only its own services comes
from each instance's own records — outcome records and trajectories — not
from what the actors report.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from camg_client import Client
from camg_client.rollout_ray import RayRolloutError, check_same_tasks, is_loopback

from tests.support.services import REPO

psutil = pytest.importorskip("psutil")

NODES = ("head", "worker1", "worker2")
#: Set in the environment of every process a test node starts.
MARKER = "CAMG_TEST_RAY_NODES"
EPISODES = 15


def ray_env() -> dict:
    # Telemetry off; a one-host cluster stays on 127.0.0.1 (Ray would swap a
    # loopback address for the host's routable one).
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture
def cluster(monkeypatch):
    """Start nodes with ``cluster.add(routes)``; everything is torn down after,
    and a Ray process that outlives the shutdown fails the test (killed by pid)."""
    # Imported here, not at collection: only this fixture needs ray.
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Unix socket paths must stay short: not under pytest's tmp_path.
    tmp = tempfile.mkdtemp(prefix="camg-ray-", dir="/tmp")
    os.makedirs(os.path.join(tmp, "ray"))
    for key, value in {**ray_env(), "RAY_TMPDIR": tmp}.items():
        monkeypatch.setenv(key, value)

    class Nodes:
        def __init__(self) -> None:
            self.ray: Cluster | None = None
            self.nodes: list = []

        def add(self, routes: str):
            args = dict(node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=1,
                        object_store_memory=80 * 1024 * 1024, dashboard_agent_listen_port=0,
                        resources={"camg": 1}, env_vars={"CAMG_ROUTES": routes})
            # Every process the node starts inherits the marker (the
            # services and the driver do not): even one a failed start
            # orphaned is found at teardown.
            with monkeypatch.context() as env:
                env.setenv(MARKER, tmp)
                if self.ray is None:
                    self.ray = Cluster(initialize_head=True, head_node_args=args)
                    node = self.ray.head_node
                else:
                    node = self.ray.add_node(**args)
            self.nodes.append(node)
            return node

        def processes(self) -> list:
            """Every process of the nodes: GCS, raylets, agents, workers (by pid)."""
            found: dict[int, psutil.Process] = {}
            for node in self.nodes:
                for infos in node.all_processes.values():
                    for info in infos:
                        try:
                            proc = psutil.Process(info.process.pid)
                            for p in (proc, *proc.children(recursive=True)):
                                found[p.pid] = p
                        except psutil.NoSuchProcess:
                            pass
            return list(found.values())

        def marked(self) -> list:
            """Ours even when orphaned: the marker in its environment, or (a
            process that retitled itself clobbers its environ) a log file
            open under this cluster's directory."""
            found = []
            for proc in psutil.process_iter():
                try:
                    if (proc.environ().get(MARKER) == tmp
                            or any(f.path.startswith(tmp + "/") for f in proc.open_files())):
                        found.append(proc)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            return found

    nodes = Nodes()
    yield nodes
    spawned = {p.pid: p for p in nodes.processes() + nodes.marked()}
    if nodes.ray is not None:
        nodes.ray.shutdown()
    gone, alive = psutil.wait_procs(list(spawned.values()), timeout=15)
    alive += [p for p in nodes.marked() if p.pid not in spawned]
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    subprocess.run(["rm", "-rf", tmp], check=False)
    assert not alive, f"Ray processes outlived the cluster's shutdown: {alive}"


def listening(processes) -> list[str]:
    addresses = []
    for proc in processes:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        addresses += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    return addresses


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
        counter_service, cluster, tmp_path):
    services = [counter_service(references=True, capacity=4, wait=False) for _ in NODES]
    for service in services:
        service.wait_ready()
    routes = [str(s.config_path.parent / "routes.json") for s in services]
    nodes = [cluster.add(r) for r in routes]
    # Every Ray listener of the three "hosts" is on loopback.
    assert {p.pid for p in cluster.processes()} <= {p.pid for p in cluster.marked()}
    addresses = listening(cluster.processes())
    assert addresses and all(map(on_loopback, addresses)), addresses

    out = tmp_path / "run.jsonl"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "camg_client", "--ray", cluster.ray.address,
         # No such file on any node: each node's CAMG_ROUTES must win.
         "--routes", str(tmp_path / "absent" / "routes.json"), "--env", "counter",
         "--policy", "oracle", "--episodes", str(EPISODES), "--concurrency", "2",
         "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.monotonic() - started
    print(f"rollout over 3 nodes: {wall:.1f} s\n{proc.stdout}")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout
    body = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
    assert body["episodes"] == str(EPISODES) and body["rewarded"] == str(EPISODES)
    assert body["reward_min"] == "1" and body["errors"] == "0" and body["nodes"] == "3"

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == EPISODES and all(line["reward"] == 1.0 for line in lines)
    by_node: dict[str, set[str]] = {}
    for line in lines:
        by_node.setdefault(line["node"], set()).add(line["episode_id"])
    # Episodes ran on every node ...
    assert set(by_node) == {node.node_id for node in nodes}, (by_node, wall)
    for node, service in zip(nodes, services):
        mine = by_node[node.node_id]
        assert mine
        # ... and each instance saw exactly its own node's episodes, by its own records.
        outcomes, trajectories = records(service)
        assert outcomes == mine, (node.node_id, outcomes ^ mine)
        assert trajectories == mine
    # The actors' workers listened on loopback too; every episode was closed.
    addresses = listening(cluster.processes())
    assert all(map(on_loopback, addresses)), addresses
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
    # ray is a trainer-side extra (requirements/trainer.in), not in the services' lock.
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

    def remote(self, task_id, seed):
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
