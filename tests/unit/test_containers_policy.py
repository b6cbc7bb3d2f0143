"""The container mediator's policy and wire pieces, without Docker or root.

The same refusals run against a real dockerd in
tests/privileged/test_containers.py; here each rule is checked in isolation.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from camg import errors, helper_client
from camg import helper_wire as wire
from helper import config as helper_config
from helper import containers as mc
from helper.sandbox_table import Peer

IMAGE = "127.0.0.1:5000/camg/x@sha256:" + "a" * 64
PEER = Peer(uid=990, gid=990, pid=1, owner="general")


@pytest.fixture
def mediator(tmp_path):
    manifest = tmp_path / "images.json"
    manifest.write_text(json.dumps({"images": [IMAGE]}))
    cfg = mc.ContainerConfig(images_manifest=str(manifest), scope="unit", max_cpu=2.0,
                             max_memory_bytes=1 << 30, max_pids=512)
    ceilings = helper_config.Ceilings(archive_bytes=1 << 20, output_bytes=1 << 16, timeout=60,
                                      command_bytes=1 << 16, env_entries=4)
    return mc.Mediator(cfg, agent_uid=2000, agent_gid=2000, ceilings=ceilings)


def params(**kw) -> wire.ContainerCreateParams:
    base = dict(image=IMAGE, cpu=1.0, memory_bytes=256 << 20, pids_max=128)
    base.update(kw)
    return wire.ContainerCreateParams(**base)


def refused(fn, name: str) -> None:
    with pytest.raises(wire.WireError) as info:
        fn()
    assert info.value.name == name, info.value.message


def test_only_manifest_images_by_digest(mediator):
    assert mediator.check_image(IMAGE) == IMAGE
    refused(lambda: mediator.check_image(IMAGE.replace("a" * 64, "b" * 64)), "not_allowed")
    refused(lambda: mediator.check_image("127.0.0.1:5000/camg/x:latest"), "not_allowed")
    refused(lambda: mediator.check_image("debian"), "not_allowed")


def test_an_unreadable_manifest_allows_nothing(tmp_path):
    m = mc.Mediator(mc.ContainerConfig(images_manifest=str(tmp_path / "missing.json")), agent_uid=2000,
                    agent_gid=2000, ceilings=helper_config.Ceilings())
    refused(lambda: m.check_image(IMAGE), "not_allowed")
    (tmp_path / "missing.json").write_text(json.dumps({"images": ["debian:latest"]}))
    refused(lambda: m.check_image(IMAGE), "not_allowed")


@pytest.mark.parametrize("kw,name", [
    ({"privileged": True}, "not_allowed"),
    ({"cap_add": ("NET_ADMIN",)}, "not_allowed"),
    ({"devices": ("/dev/sda",)}, "not_allowed"),
    ({"binds": ("/:/host",)}, "not_allowed"),
    ({"network": "bridge"}, "not_allowed"),
    ({"mount_agent_env": True}, "not_allowed"),  # none configured
    ({"labels": {"camg.service": "coding"}}, "not_allowed"),
    ({"labels": {"camg.boot": "forged"}}, "not_allowed"),
    ({"labels": {"org.example": "x"}}, "not_allowed"),
    ({"cpu": 2.5}, "limit_exceeded"),
    ({"cpu": 0.0}, "limit_exceeded"),
    ({"memory_bytes": 2 << 30}, "limit_exceeded"),
    ({"pids_max": 513}, "limit_exceeded"),
    ({"episode_id": "a b"}, "bad_request"),
    ({"command": ("a\0b",)}, "limit_exceeded"),
    ({"env": {"BAD-NAME": "x"}}, "bad_request"),
    # The configured ceiling (env_entries=4 above), the one Exec is held to.
    ({"env": {f"V{i}": "x" for i in range(5)}}, "limit_exceeded"),
    ({"workdir": "relative"}, "bad_request"),
])
def test_create_refusals(mediator, kw, name):
    refused(lambda: mediator.check_create(PEER, params(**kw)), name)


def test_labels_are_the_helpers(mediator):
    labels = mediator.check_create(PEER, params(episode_id="ep-1", labels={"camg.episode": "ep-1"}))
    assert labels == {"camg.helper": "unit", "camg.boot": mediator.boot, "camg.service": "general",
                      "camg.uid": "990", "camg.episode": "ep-1", "camg.pool": "0"}


def test_unknown_create_fields_are_bad_requests():
    with pytest.raises(wire.WireError) as info:
        wire.parse(wire.ContainerCreateParams, {"image": IMAGE, "cpu": 1.0, "memory_bytes": 1 << 28, "pids_max": 64,
                                     "security_opt": ["seccomp=unconfined"]}, "params",
                   lambda m: wire.WireError("bad_request", m))
    assert "security_opt" in info.value.message


def test_container_ids_and_ownership(mediator):
    refused(lambda: mediator.get(PEER, "../../etc"), "bad_request")
    refused(lambda: mediator.get(PEER, "0" * 64), "not_found")
    mediator.held["1" * 64] = mc.Held("1" * 64, 990, "general", IMAGE, "", False, 0.0, -1)
    assert mediator.get(PEER, "1" * 64).owner == "general"
    refused(lambda: mediator.get(Peer(990, 990, 1, "visual"), "1" * 64), "not_found")
    refused(lambda: mediator.get(Peer(991, 990, 1, "general"), "1" * 64), "not_found")


def test_config_section_parses_strictly(tmp_path):
    path = tmp_path / "helper.json"
    path.write_text(json.dumps({"containers": {"scope": "system", "max_cpu": 2}}))
    assert helper_config.load(str(path)).containers.max_cpu == 2.0
    for bad in ({"scope": "-x"}, {"docker_socket": "relative"}, {"max_pids": 0}, {"privileged": True}):
        path.write_text(json.dumps({"containers": bad}))
        with pytest.raises(helper_config.ConfigError):
            helper_config.load(str(path))
    assert helper_config.load(None).containers is None


def test_new_error_names_map_to_classes():
    assert helper_client.ERROR_CLASSES["not_allowed"] is errors.PermissionDenied
    assert helper_client.ERROR_CLASSES["docker_unavailable"] is errors.Unavailable
    assert helper_client.ERROR_CLASSES["connection_refused"] is errors.Unavailable


def test_a_descriptor_rides_on_a_frame():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wire.send_frame(a, {"ok": True, "result": {"port": 1}}, wire.FdBlob.carrying(w))
        with pytest.raises(OSError):
            os.fstat(w)  # the sender's copy is closed once sent
        obj, blob, fd = wire.read_frame_with_fd(b, 1 << 20)
        assert obj == {"ok": True, "result": {"port": 1}} and blob == b"" and fd >= 0
        os.write(fd, b"x")
        os.close(fd)
        assert os.read(r, 1) == b"x"
        wire.send_frame(a, {"ok": False, "error": "not_found", "message": "m"})
        assert wire.read_frame_with_fd(b, 1 << 20)[2] == -1
    finally:
        a.close()
        b.close()
        os.close(r)


class _Client:
    """A ContainerClient as the pool sees it: creates under the current
    helper instance; ``restart()`` is a killed and restarted helper (whose
    start-up sweep removed every container of the old one)."""

    def __init__(self) -> None:
        self.instance, self.made, self.removed = "one", 0, []

    def create(self, spec, *, episode_id: str = "", pool: bool = False):
        from camg.sandboxes.containers import Container
        self.made += 1
        return Container(f"c{self.made}", "img", episode_id, pool, self.instance)

    def helper_instance(self) -> str:
        return self.instance

    def remove(self, container_id: str) -> bool:
        self.removed.append(container_id)
        return True

    def restart(self) -> None:
        self.instance = "two"


def test_a_pool_never_hands_out_a_container_a_restarted_helper_swept():
    # The kill storm found it: after the helper's kill -9, the next reset
    # claimed a swept container and failed (503 "no container for this peer").
    from camg.sandboxes.containers import ContainerPool
    client = _Client()
    pool = ContainerPool(client, spec=None, size=2, retry_delay=0.01)
    try:
        assert pool.wait_full(5)
        first = pool.claim("e1")
        assert first.instance == "one" and pool.hits == 1
        assert pool.wait_full(5)
        client.restart()
        claimed = pool.claim("e2")
        assert claimed.instance == "two", claimed
        assert pool.swept == 2  # (made on the spot, or by the refill meanwhile)
        assert pool.wait_full(5)  # refilled under the new helper
        assert all(c.instance == "two" for c in pool.ready)
    finally:
        pool.close()


def test_connect_ports_and_the_endpoint(mediator):
    """Port 0 names the endpoint socket; no other out-of-range port passes."""
    held = mc.Held("1" * 64, 990, "general", IMAGE, "", False, 0.0, -1)
    for port in (-1, 65536, True):
        refused(lambda port=port: mediator.connect(held, port, 1.0), "bad_request")
    refused(lambda: mediator.connect(held, 0, 61.0), "limit_exceeded")
    from camg.sandboxes.containers import ENDPOINT
    from tests.support import mimo_tasks  # noqa: F401 -- puts the runtime on sys.path
    from mimoagent.transport.listener import SOCKET_PATH
    assert mc.ENDPOINT == ENDPOINT == 0 and mc.ENDPOINT_SOCKET == SOCKET_PATH


@pytest.mark.skipif(os.geteuid() != 0, reason="joins another process's mount namespace")
def test_endpoint_resolves_in_the_process_mount_namespace(tmp_path):
    """The path resolves where the container's processes see it: here a
    process in a mount namespace of its own listens on a tmpfs mounted only
    there; the host's directory stays empty. Its peer is root."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    where = tmp_path / "ns"
    where.mkdir()
    path = str(where / "d" / "t.sock")
    server = ("import os, socket, struct, sys\n"
              "os.mkdir(os.path.dirname(sys.argv[1]), 0o700)\n"
              "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
              "print('ready', flush=True)\n"
              "c, _ = s.accept()\n"
              "raw = c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)\n"
              "uid = struct.unpack('3i', raw)[1]\n"
              "c.sendall(str(uid).encode()); c.close()\n")
    run = f"mount -t tmpfs none {where} && exec {sys.executable} -c \"$0\" \"$1\""
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", run,
                             server, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert not os.listdir(where)  # the host's view: nothing there
        pidfd = os.pidfd_open(proc.pid)
        try:
            refused(lambda: mc.connect_endpoint(pidfd, 2.0, path=path + "x"), "connection_refused")
            with mc.connect_endpoint(pidfd, 5.0, path=path) as sock:
                assert sock.family == socket.AF_UNIX and sock.recv(16) == b"0"
        finally:
            os.close(pidfd)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
