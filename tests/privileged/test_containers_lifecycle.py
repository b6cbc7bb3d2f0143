"""Containers over their lifetime: the warm pool, kill -9 of a service or of the helper, sweeps.

After a service is killed, its unit's ExecStopPost (release-all --owner)
removes its containers; after the helper is killed, ``--sweep`` or the next
helper's start-up removes every container of the helper's scope, and
nothing outside that scope is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest  # noqa: F401

from camg.sandboxes.containers import ContainerClient, ContainerPool
from tests.privileged.conftest import ROOT, stop_helper
from tests.privileged.container_fixtures import (  # noqa: F401  (fixtures)
    cc, container_helper, image_ref, needs_docker, spec, start_container_helper)
from tests.support import container_image as ci

pytestmark = needs_docker


def _scope_containers(scope: str) -> list[dict]:
    api = ci.docker_api()
    try:
        return api.containers(all=True, filters={"label": [f"camg.helper={ci.scope_for(scope)}"]})
    finally:
        api.close()


def test_pool_claim_refill_and_close(cc, image_ref):
    pool = ContainerPool(cc, spec(image_ref), size=2)
    try:
        assert pool.wait_full(60), pool.last_error
        pooled = {c["container_id"] for c in cc.list()}
        assert len(pooled) == 2 and all(c["pool"] and c["episode_id"] == "" for c in cc.list())
        claimed = pool.claim("ep-pool")
        assert claimed.id in pooled and claimed.episode_id == "ep-pool" and pool.hits == 1
        # A claimed container is started and never used: it runs its command.
        assert cc.exec(claimed.id, "echo fresh").output == "fresh\n"
        assert pool.wait_full(60), "the pool did not refill in the background"
        assert len(cc.list()) == 3
    finally:
        pool.close()
    assert [c["container_id"] for c in cc.list()] == [claimed.id]  # close removed the unclaimed
    cc.remove(claimed.id)


def test_empty_pool_claim_creates_on_the_spot(cc, image_ref):
    pool = ContainerPool(cc, spec(image_ref), size=0)
    try:
        c = pool.claim("ep-miss")
        assert pool.misses == 1 and not c.pool
        [listed] = cc.list()
        assert listed["episode_id"] == "ep-miss" and listed["pool"] is False
    finally:
        pool.close()
    cc.remove(c.id)


SERVICE = textwrap.dedent("""
    import sys, time
    from camg.sandboxes.containers import ContainerClient, ContainerPool, ContainerSpec
    cc = ContainerClient(sys.argv[1], owner=sys.argv[2])
    spec = ContainerSpec(image=sys.argv[3], cpu=0.5, memory_bytes=128 << 20, pids_max=64)
    cc.create(spec, episode_id="ep-a")
    cc.create(spec, episode_id="ep-b")
    pool = ContainerPool(cc, spec, size=2)
    assert pool.wait_full(60)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_kill9_of_a_service_then_its_release_leaves_nothing(container_helper, image_ref):
    owner = f"svc{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", SERVICE, container_helper.socket, owner, image_ref],
                            stdout=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline() == b"ready\n"
        watcher = ContainerClient(container_helper.socket, owner=owner)
        assert len(watcher.list()) == 4
        volumes = _volumes([c["container_id"] for c in watcher.list()])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # What the unit's ExecStopPost runs after the kill.
    subprocess.run([sys.executable, "-m", "camg.helper_client", "release-all", "--socket",
                    container_helper.socket, "--owner", owner], check=True, env=env, cwd=ROOT,
                   capture_output=True)
    assert watcher.list() == []
    assert len(volumes) == 4 and _existing_volumes(volumes) == set()
    assert not [c for c in _scope_containers("containers") if c["Labels"]["camg.service"] == owner]


def _volumes(container_ids: list[str]) -> set[str]:
    api = ci.docker_api()
    try:
        return {m["Name"] for cid in container_ids for m in api.inspect_container(cid)["Mounts"]
                if m["Type"] == "volume"}
    finally:
        api.close()


def _existing_volumes(names: set[str]) -> set[str]:
    api = ci.docker_api()
    try:
        return names & {v["Name"] for v in api.volumes()["Volumes"] or []}
    finally:
        api.close()


def _bystander(image_ref: str) -> str:
    """A container of ours in another scope: sweeps must leave it alone."""
    api = ci.docker_api()
    try:
        c = api.create_container(image_ref, command=["sleep", "600"],
                                 labels={"camg.helper": ci.scope_for("bystander")},
                                 host_config=api.create_host_config(init=True, network_mode="none"))
        api.start(c["Id"])
        return c["Id"]
    finally:
        api.close()


def test_kill9_of_the_helper_then_sweep_and_restart(image_ref, lower_root, rootfs):
    base = Path(tempfile.mkdtemp(prefix="camg-containers-sweep-"))
    bystander = _bystander(image_ref)
    helper = None
    try:
        for how in ("sweep", "restart"):
            helper = start_container_helper(base, image_ref, lower_root, rootfs, "sweep")
            cc = ContainerClient(helper.socket, owner="victim")
            for _ in range(2):
                cc.create(spec(image_ref))
            cc.close()
            held = [c["Id"] for c in _scope_containers("sweep")]
            assert len(held) == 2
            volumes = _volumes(held)
            assert len(volumes) == 2  # the image's VOLUME: one anonymous volume each
            helper.proc.send_signal(signal.SIGKILL)
            helper.proc.wait()
            # A dead helper's containers outlive it (Docker keeps them)...
            assert len(_scope_containers("sweep")) == 2
            if how == "sweep":
                # ...until the unit's ExecStopPost sweep,
                r = subprocess.run([sys.executable, "-m", "helper", "--config", str(base / "helper.json"),
                                    "--sweep"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                   capture_output=True, text=True)
                assert r.returncode == 0, r.stderr
                assert _scope_containers("sweep") == []
                assert _existing_volumes(volumes) == set()
                stop_helper(helper)
            else:
                # ...or the next helper's start-up sweep.
                stop_helper(helper)
                helper = start_container_helper(base, image_ref, lower_root, rootfs, "sweep")
                assert _scope_containers("sweep") == []
                assert _existing_volumes(volumes) == set()
                assert ContainerClient(helper.socket, owner="victim").list() == []
                stop_helper(helper)
            helper = None
        api = ci.docker_api()
        assert api.inspect_container(bystander)["State"]["Running"], "a sweep touched another scope"
        api.close()
    finally:
        if helper is not None:
            stop_helper(helper)
        api = ci.docker_api()
        api.remove_container(bystander, force=True, v=True)
        api.close()
        shutil.rmtree(base)
