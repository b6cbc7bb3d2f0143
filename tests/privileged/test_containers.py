"""The container mediator against a real dockerd: refusals, round trip, connect, ownership.

Every container is made through a helper started with a ``containers``
section; the test image comes back from a loopback registry by digest.
The leak check (conftest) fails any test that leaves a container of ours.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from camg import errors
from camg.sandboxes.containers import ContainerClient
from camg.helper_client import HelperClient
from tests.privileged.conftest import stop_helper
from tests.privileged.container_fixtures import (  # noqa: F401  (fixtures)
    PORT, cc, container_helper, image_ref, needs_docker, server_spec, spec, start_container_helper,
    tar_of)
from tests.support import container_image as ci

pytestmark = needs_docker


# -- refusals ----------------------------------------------------------------

def _refused(cc: ContainerClient, params: dict, cls: type, name: str) -> None:
    with pytest.raises(cls) as info:
        cc.create_raw(params)
    assert info.value.details["helper_error"] == name, info.value


def test_mediator_refuses_what_is_not_allowed(cc, image_ref):
    ok = spec(image_ref).params()
    unlisted = image_ref.rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    _refused(cc, {**ok, "image": unlisted}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "image": "debian:bookworm"}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "privileged": True}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "binds": ["/etc:/host-etc"]}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "cap_add": ["SYS_ADMIN"]}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "devices": ["/dev/kmsg"]}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "network": "host"}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "mount_agent_env": True}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "labels": {"camg.service": "coding"}}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "labels": {"com.example.owner": "x"}}, errors.PermissionDenied, "not_allowed")
    _refused(cc, {**ok, "memory_bytes": 2 << 30}, errors.BadRequest, "limit_exceeded")
    _refused(cc, {**ok, "cpu": 3.0}, errors.BadRequest, "limit_exceeded")
    _refused(cc, {**ok, "pids_max": 100000}, errors.BadRequest, "limit_exceeded")
    _refused(cc, {**ok, "security_opt": ["seccomp=unconfined"]}, errors.BadRequest, "bad_request")
    _refused(cc, {**ok, "episode_id": "../x y"}, errors.BadRequest, "bad_request")
    assert cc.list() == []


def test_true_labels_may_be_repeated(cc, image_ref):
    c = cc.create_raw({**spec(image_ref).params(), "episode_id": "ep-1",
                       "labels": {"camg.service": f"t{os.getpid()}", "camg.episode": "ep-1"}})
    [listed] = cc.list()
    assert listed["container_id"] == c["container_id"] and listed["episode_id"] == "ep-1"
    assert cc.remove(c["container_id"]) is True


# -- an accepted container ------------------------------------------------------

def test_round_trip_create_exec_copy_remove(cc, image_ref):
    c = cc.create(spec(image_ref), episode_id="ep-round")
    info = ci.docker_api().inspect_container(c.id)
    host = info["HostConfig"]
    assert host["Init"] is True and host["NetworkMode"] == "none" and host["Privileged"] is False
    assert host["Memory"] == 128 << 20 and host["PidsLimit"] == 64 and host["NanoCpus"] == 5 * 10**8
    assert not host["Binds"] and not host["CapAdd"] and "no-new-privileges" in host["SecurityOpt"]
    labels = info["Config"]["Labels"]
    assert labels["camg.episode"] == "ep-round" and labels["camg.service"] == f"t{os.getpid()}"
    assert labels["camg.uid"] == "0" and labels["camg.helper"] == ci.scope_for("containers")

    r = cc.exec(c.id, "id -u; ls /sys/class/net", user="agent")
    assert (r.exit_code, r.output.split()) == (0, ["2000", "lo"])  # no network but loopback
    r = cc.exec(c.id, "cat; echo; exit 3", user="root", stdin=b"from stdin")
    assert (r.exit_code, r.output) == (3, "from stdin\n")

    cc.exec(c.id, "mkdir -p /work", user="root")
    cc.put_archive(c.id, "/work", tar_of({"a.txt": b"alpha", "sub/b.txt": b"beta"}))
    assert cc.exec(c.id, "cat /work/a.txt /work/sub/b.txt").output == "alphabeta"
    with tarfile.open(fileobj=io.BytesIO(cc.get_archive(c.id, "/work/sub"))) as tar:
        assert tar.extractfile("sub/b.txt").read() == b"beta"
    with pytest.raises(errors.NotFound):
        cc.get_archive(c.id, "/no/such/path")

    assert cc.remove(c.id) is True
    assert cc.remove(c.id) is False  # idempotent
    with pytest.raises(errors.NotFound):
        cc.exec(c.id, "true")


def test_usage_counts_cpu_memory_and_the_writable_layer(cc, image_ref):
    c = cc.create(spec(image_ref))
    try:
        r = cc.exec(c.id, "head -c 1048576 /dev/urandom > /cost-blob && i=0; "
                    "while [ $i -lt 200000 ]; do i=$((i+1)); done", user="root", timeout=120)
        assert r.exit_code == 0, r.output
        used = cc.usage(c.id)
        assert used["cpu_s"] > 0.05 and used["memory_peak_bytes"] > 0, used
        assert used["disk_written_bytes"] >= 1 << 20, used
    finally:
        cc.remove(c.id)
    with pytest.raises(errors.NotFound):
        cc.usage(c.id)


def test_exec_output_tail_and_timeout(cc, image_ref):
    c = cc.create(spec(image_ref))
    r = cc.exec(c.id, "head -c 50000 /dev/zero | tr '\\0' a; printf END", output_limit=1000)
    assert r.truncated and r.output.endswith("a" * 997 + "END") and r.output.startswith("[output truncated")
    t0 = time.monotonic()
    r = cc.exec(c.id, "sleep 30 & sleep 30", timeout=1)
    assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 10
    cc.remove(c.id)


def test_connect_reaches_the_server_inside(cc, image_ref):
    c = cc.create(server_spec(image_ref), episode_id="ep-conn")
    for i in range(3):
        with cc.connect(c.id, PORT, timeout=15) as sock:
            assert sock.family == socket.AF_INET
            sock.sendall(b"hello %d\n" % i)
            assert sock.makefile("rb").readline() == b"echo:hello %d\n" % i
    with pytest.raises(errors.Unavailable) as info:
        cc.connect(c.id, PORT + 1, timeout=0.3)
    assert info.value.details["helper_error"] == "connection_refused"
    cc.remove(c.id)
    with pytest.raises(errors.NotFound):
        cc.connect(c.id, PORT, timeout=1)


def test_connect_to_an_exited_container_is_sandbox_died(cc, image_ref):
    c = cc.create(spec(image_ref, command=("sleep", "0.3")))
    time.sleep(1.5)
    with pytest.raises(errors.SandboxDied):
        cc.connect(c.id, PORT, timeout=1)
    cc.remove(c.id)


def test_a_peer_sees_only_its_own_containers(cc, container_helper, image_ref):
    c = cc.create(spec(image_ref))
    other = ContainerClient(container_helper.socket, owner="someone-else")
    try:
        assert other.list() == []
        for call in (lambda: other.exec(c.id, "true"), lambda: other.connect(c.id, PORT, timeout=1),
                     lambda: other.get_archive(c.id, "/etc"), lambda: other.logs(c.id),
                     lambda: other.usage(c.id)):
            with pytest.raises(errors.NotFound):
                call()
        assert other.remove(c.id) is False
        assert other.release_all() == 0
        assert [x["container_id"] for x in cc.list()] == [c.id]
    finally:
        other.close()
    cc.remove(c.id)


def test_release_all_verb_removes_containers_too(cc, container_helper, image_ref):
    for _ in range(2):
        cc.create(spec(image_ref))
    # The units' ExecStopPost: python -m camg.helper_client release-all --owner NAME
    result = HelperClient(container_helper.socket, owner=cc.helper.owner).call("ReleaseAll")[0]
    assert result == {"released": 0, "containers": 2}
    assert cc.list() == []


def test_capacity_per_peer(cc, image_ref):
    made = [cc.create(spec(image_ref)) for _ in range(8)]
    with pytest.raises(errors.AtCapacity):
        cc.create(spec(image_ref))
    for c in made:
        cc.remove(c.id)


def starts(helper) -> dict:
    with HelperClient(helper.socket) as h:
        return h.ping()["container_starts"]


def test_more_creates_at_once_than_concurrent_starts_all_succeed(image_ref, lower_root, rootfs):
    """8 creates at once through a helper that starts 2 at a time: all 8
    run; Ping saw the rest waiting and never more than 2 in flight."""
    base = Path(tempfile.mkdtemp(prefix="camg-containers-gate-"))
    helper = start_container_helper(base, image_ref, lower_root, rootfs, "gate", concurrent_starts=2)
    owner = f"t{os.getpid()}"
    c = ContainerClient(helper.socket, owner=owner)
    try:
        c.pull(image_ref)
        assert starts(helper) == {"limit": 2, "in_flight": 0, "waiting": 0, "peak": 0, "served": 0}
        made, failed, seen = [], [], []
        done = threading.Event()

        def watch():
            with HelperClient(helper.socket) as pinger:
                while not done.is_set():
                    seen.append(pinger.ping()["container_starts"])
                    time.sleep(0.01)

        def create(i):
            try:
                made.append(c.create(spec(image_ref), episode_id=f"g{i}"))
            except Exception as exc:  # noqa: BLE001  reported below
                failed.append(exc)

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        done.set()
        watcher.join(10)
        assert failed == [] and len(made) == 8
        assert max(s["in_flight"] for s in seen) == 2 and max(s["waiting"] for s in seen) >= 1, seen
        assert starts(helper) == {"limit": 2, "in_flight": 0, "waiting": 0, "peak": 2, "served": 8}
        assert sorted(x["container_id"] for x in c.list()) == sorted(x.id for x in made)
        for x in made:
            assert c.exec(x.id, "echo up").output == "up\n"
        assert c.release_all() == 8 and c.list() == []
    finally:
        c.release_all()
        c.close()
        stop_helper(helper)
        shutil.rmtree(base)


def test_reap_kills_the_agents_processes_from_outside_with_the_pids_limit_full(cc, image_ref):
    """ContainerReap: a detached agent process that forks until the pids
    limit refuses (every fork in the container fails with EAGAIN then, a
    root process's too) is killed from the host, with everything it
    started; the main process (the server) stays and answers."""
    c = cc.create(server_spec(image_ref), episode_id="ep-reap")
    try:
        # (a shell gives up at its first failed fork; this retries for ever)
        bomb = ("while (1) { my $p = fork; if (defined $p && !$p) { sleep 1000; exit } "
                "select(undef, undef, undef, 0.01) unless defined $p }")
        r = cc.exec(c.id, f"setsid nohup perl -e '{bomb}' >/dev/null 2>&1 < /dev/null & sleep 2",
                    user="agent", timeout=30)
        assert r.exit_code == 0, r.output
        # (a process moved into the cgroup is not counted against its
        # limit, so the exec itself starts: a fork inside it fails)
        full = cc.exec(c.id, "/bin/true && echo forked", user="root")
        assert "forked" not in full.output and full.exit_code != 0, full
        reaped = cc.reap(c.id)
        assert reaped["killed"] >= 40, reaped
        assert cc.reap(c.id)["killed"] == 0  # idempotent: none left
        r = cc.exec(c.id, "grep -l '^Uid:.*2000' /proc/[0-9]*/status | wc -l; echo forked",
                    user="root")
        assert r.output.split() == ["0", "forked"], r.output
        with cc.connect(c.id, PORT, timeout=15) as sock:
            sock.sendall(b"after\n")
            assert sock.makefile("rb").readline() == b"echo:after\n"
    finally:
        cc.remove(c.id)
    with pytest.raises(errors.NotFound):
        cc.reap(c.id)
