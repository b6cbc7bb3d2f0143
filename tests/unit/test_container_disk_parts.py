"""The container writable-layer bound's pure parts (helper/container_disk.py,
ContainerConfig's upper_* fields); the bound itself is checked against the
real dockerd in tests/privileged/test_container_disk.py."""

from __future__ import annotations

import pytest

from helper import container_disk
from helper.container_config import ContainerConfig, ContainerConfigError


def test_the_default_bound_and_its_refusals():
    cfg = ContainerConfig()
    assert cfg.upper_bytes == 4 << 30 and cfg.upper_inodes == 1 << 18
    assert cfg.shm_bytes == 64 << 20 and cfg.shm_inodes == 4096
    for bad in ({"upper_bytes": 1 << 20}, {"upper_inodes": 10}, {"upper_root": "relative"},
                {"shm_bytes": 0}, {"shm_inodes": 0}):
        with pytest.raises(ContainerConfigError):
            ContainerConfig(**bad)


def test_the_layer_is_the_overlay2_upper_s_parent():
    inspected = {"GraphDriver": {"Name": "overlay2", "Data": {
        "UpperDir": "/var/lib/docker/overlay2/abc/diff", "WorkDir": "/var/lib/docker/overlay2/abc/work"}}}
    assert container_disk.layer_dir(inspected) == "/var/lib/docker/overlay2/abc"
    # another storage driver: nothing this module knows how to bound
    assert container_disk.layer_dir({"GraphDriver": {"Name": "vfs", "Data": None}}) is None
    assert container_disk.layer_dir({}) is None


def test_release_is_idempotent(tmp_path):
    layer = tmp_path / "layer"
    layer.mkdir()
    image = tmp_path / "c1.img"
    image.write_bytes(b"")
    container_disk.release(str(layer), str(tmp_path), "c1")
    assert not image.exists() and layer.is_dir()
    container_disk.release(str(layer), str(tmp_path), "c1")  # already gone: success
    container_disk.release(None, str(tmp_path), "c2")  # never made
