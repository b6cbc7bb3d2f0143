"""Run inside the ray venv (tests/support/framework_venvs.py, the client's
``ray`` extra), never the services' venv: a local Ray cluster of one node per
routes file, ``python -m camg_client --ray`` over it, then the cluster's
teardown, reported as one JSON document on stdout for
tests/unit/test_rollout_ray.py to assert on.

    python ray_nodes.py OUT.json ROUTES... -- ROLLOUT-ARGS...

One machine stands in for several hosts: each node is started with the
``camg`` resource and ``CAMG_ROUTES`` naming its own routes file. Every
process a node starts inherits a marker in its environment (the services
and this driver do not), so even one a failed start orphaned is found and
killed (by pid) at the end, and reported as a leftover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import ray  # noqa: F401  (puts ray's vendored psutil on sys.path)
import psutil
from ray.cluster_utils import Cluster

MARKER = "CAMG_TEST_RAY_NODES"


def _processes(nodes) -> list:
    """Every process of the nodes: GCS, raylets, agents, workers (by pid)."""
    found: dict[int, psutil.Process] = {}
    for node in nodes:
        for infos in node.all_processes.values():
            for info in infos:
                try:
                    proc = psutil.Process(info.process.pid)
                    for p in (proc, *proc.children(recursive=True)):
                        found[p.pid] = p
                except psutil.NoSuchProcess:
                    pass
    return list(found.values())


def _marked(tmp: str) -> list:
    """Ours even when orphaned: the marker in its environment, or (a process
    that retitled itself clobbers its environ) a log file open under this
    cluster's directory."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (proc.environ().get(MARKER) == tmp
                    or any(f.path.startswith(tmp + "/") for f in proc.open_files())):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _listening(processes) -> list[str]:
    addresses = []
    for proc in processes:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        addresses += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    return addresses


def main(argv: list[str]) -> int:
    out_path, rest = argv[0], argv[1:]
    split = rest.index("--")
    routes, rollout_args = rest[:split], rest[split + 1:]
    # Unix socket paths must stay short: not under pytest's tmp_path.
    tmp = tempfile.mkdtemp(prefix="camg-ray-", dir="/tmp")
    os.makedirs(os.path.join(tmp, "ray"))
    # Telemetry off; a one-host cluster stays on 127.0.0.1 (Ray would swap a
    # loopback address for the host's routable one).
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                      RAY_TMPDIR=tmp)
    report: dict = {"nodes": [], "problems": []}
    cluster, nodes = None, []
    try:
        for r in routes:
            args = dict(node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=1,
                        object_store_memory=80 * 1024 * 1024, dashboard_agent_listen_port=0,
                        resources={"camg": 1}, env_vars={"CAMG_ROUTES": r})
            os.environ[MARKER] = tmp
            try:
                if cluster is None:
                    cluster = Cluster(initialize_head=True, head_node_args=args)
                    node = cluster.head_node
                else:
                    node = cluster.add_node(**args)
            finally:
                del os.environ[MARKER]
            nodes.append(node)
            report["nodes"].append({"node_id": node.node_id, "routes": r})
        marked = {p.pid for p in _marked(tmp)}
        report["unmarked_node_processes"] = [p.pid for p in _processes(nodes)
                                             if p.pid not in marked]
        report["listening_before"] = _listening(_processes(nodes))
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "camg_client", "--ray", cluster.address,
                               *rollout_args], capture_output=True, text=True, timeout=240)
        report.update(wall=time.monotonic() - started, returncode=proc.returncode,
                      stdout=proc.stdout, stderr=proc.stderr[-3000:],
                      listening_after=_listening(_processes(nodes)))
    finally:
        spawned = {p.pid: p for p in _processes(nodes) + _marked(tmp)}
        if cluster is not None:
            cluster.shutdown()
        _, alive = psutil.wait_procs(list(spawned.values()), timeout=15)
        alive += [p for p in _marked(tmp) if p.pid not in spawned]
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        report["outlived_shutdown"] = [p.pid for p in alive]
        subprocess.run(["rm", "-rf", tmp], check=False)
        with open(out_path, "w") as f:
            json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
