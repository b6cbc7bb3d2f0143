"""Every container's writable layer is bounded in bytes and inodes
(helper/container_disk.py): / and /tmp (the overlay upper, on its own ext4),
/dev/shm (Docker's 64 MiB tmpfs), as the agent and as the container's root;
space comes back when the agent deletes; removal leaves no mount or image.
Against the system dockerd (overlay2 on this host's ext4, where
``--storage-opt size`` is refused)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from camg.sandboxes.containers import ContainerClient
from tests.privileged.conftest import helper_config, start_helper, stop_helper
from tests.privileged.container_fixtures import image_ref, needs_docker, spec  # noqa: F401
from tests.support import container_image as ci

pytestmark = needs_docker
UPPER = 48 << 20
INODES = 4096
FULL = "No space left on device"


@pytest.fixture(scope="module")
def disk_helper(image_ref, lower_root, rootfs):  # noqa: F811
    base = Path(tempfile.mkdtemp(prefix="camg-container-disk-"))
    base.chmod(0o711)
    manifest = ci.write_manifest(base / "images.json", [image_ref])
    cfg = helper_config(base, lower_root, rootfs, probe_on_start=False,
                        containers=ci.containers_config(
                            manifest, ci.scope_for("disk"), max_memory_bytes=1 << 30,
                            upper_root=str(base / "uppers"), upper_bytes=UPPER,
                            upper_inodes=INODES))
    helper = start_helper(base, cfg, wait_probes=False)
    ContainerClient(helper.socket, owner="pull").pull(image_ref)
    yield helper, base / "uppers"
    stop_helper(helper)
    shutil.rmtree(base)


@pytest.fixture
def cc(disk_helper):
    c = ContainerClient(disk_helper[0].socket, owner=f"d{os.getpid()}")
    yield c
    left = c.list()
    c.release_all()
    c.close()
    assert left == [], f"the test left containers behind: {left}"


def _fill(cc, cid: str, path: str, user: str, mib: int) -> str:
    r = cc.exec(cid, f"dd if=/dev/zero of={path} bs=1M count={mib} 2>&1; "
                f"df -k {os.path.dirname(path)} | tail -1", user=user, timeout=120)
    return r.output


def test_every_writable_path_is_bounded(cc, image_ref):  # noqa: F811
    c = cc.create(spec(image_ref, memory_bytes=512 << 20), episode_id="disk")
    try:
        # The agent through /tmp, the container's root through / itself.
        for path, user in (("/tmp/fill", "agent"), ("/fill", "root")):
            out = _fill(cc, c.id, path, user, 2 * UPPER >> 20)
            assert FULL in out, (path, out)
            cc.exec(c.id, f"rm -f {path}", user=user)
        # Deleting gives the space back: a full layer does not end the episode.
        out = _fill(cc, c.id, "/tmp/again", "agent", 8)
        assert FULL not in out and "8388608 bytes" in out, out
        cc.exec(c.id, "rm -f /tmp/again", user="agent")
        # Inodes: empty files cost no blocks, only the filesystem's inodes
        # (true, not :, whose failed redirection would end the shell).
        r = cc.exec(c.id, "mkdir /tmp/many && cd /tmp/many && i=0; while [ $i -lt 20000 ]; do "
                    "true > f$i 2>/dev/null || { echo stopped at $i; break; }; i=$((i+1)); done",
                    user="agent", timeout=120)
        stopped = int(r.output.split("stopped at ")[1].split()[0])
        assert stopped < INODES, r.output
        cc.exec(c.id, "rm -rf /tmp/many", user="agent", timeout=120)
        # /dev/shm is the helper's tmpfs (shm_bytes 64 MiB, shm_inodes 4096),
        # not Docker's, which has no inode bound.
        out = _fill(cc, c.id, "/dev/shm/fill", "agent", 100)
        assert FULL in out and " 65536 " in out, out
        cc.exec(c.id, "rm -f /dev/shm/fill", user="agent")
        r = cc.exec(c.id, "cd /dev/shm && i=0; while [ $i -lt 20000 ]; do "
                    "true > f$i 2>/dev/null || { echo stopped at $i; break; }; i=$((i+1)); done",
                    user="agent", timeout=120)
        assert "stopped at 4095" in r.output, r.output
        mounts = cc.exec(c.id, "grep ' /dev/shm ' /proc/mounts", user="agent").output
        assert "nr_inodes=4096" in mounts and "nosuid" in mounts and "nodev" in mounts, mounts
    finally:
        cc.remove(c.id)


def test_removal_leaves_no_mount_and_no_image(cc, disk_helper, image_ref):  # noqa: F811
    uppers = disk_helper[1]
    c = cc.create(spec(image_ref))
    api = ci.docker_api()
    try:
        layer = os.path.dirname(api.inspect_container(c.id)["GraphDriver"]["Data"]["UpperDir"])
    finally:
        api.close()
    assert os.path.ismount(layer)
    assert (uppers / f"{c.id}.img").is_file()
    assert cc.remove(c.id) is True
    assert not os.path.ismount(layer) and not os.path.exists(layer)
    assert not (uppers / f"{c.id}.img").exists()
    assert cc.remove(c.id) is False
