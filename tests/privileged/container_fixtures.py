"""Shared fixtures for container tests: the test image by digest and a helper that mediates Docker.

Test modules import from here (like oci_fixtures.py). The image is published
once per session to a loopback registry and pulled back by digest through
the helper (tests/support/container_image.py).
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

from camg.sandboxes.containers import ContainerClient, ContainerSpec
from tests.privileged.conftest import allow_process, helper_config, start_helper, stop_helper
from tests.support import container_image as ci
from tools.loopback_registry import LocalRegistry

PORT = 8123
needs_docker = pytest.mark.skipif(not os.path.exists("/var/run/docker.sock"),
                                  reason="no dockerd (packaging/run-tests.sh starts one)")


@pytest.fixture(scope="session")
def image_ref(rootfs):
    base = Path(tempfile.mkdtemp(prefix="camg-containers-registry-"))
    registry = LocalRegistry(base).start()
    allow_process(registry.pid)
    api = ci.docker_api()
    try:
        ref = ci.publish_test_image(api, rootfs, registry.address)
        yield ref
        ci.remove_image(api, ref)
    finally:
        api.close()
        registry.stop()
        shutil.rmtree(base)


def start_container_helper(base: Path, image_ref: str, lower_root: Path, rootfs: Path, scope: str,
                           **containers):
    """``containers``: more of the helper's containers section."""
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o711)
    manifest = ci.write_manifest(base / "images.json", [image_ref])
    section = dict(max_cpu=2.0, max_memory_bytes=1 << 30, max_pids=1024, containers_per_peer=8)
    section.update(containers)
    cfg = helper_config(base, lower_root, rootfs, probe_on_start=False,
                        containers=ci.containers_config(manifest, ci.scope_for(scope), **section))
    return start_helper(base, cfg, wait_probes=False)


@pytest.fixture(scope="module")
def container_helper(image_ref, lower_root, rootfs):
    base = Path(tempfile.mkdtemp(prefix="camg-containers-test-"))
    helper = start_container_helper(base, image_ref, lower_root, rootfs, "containers")
    ContainerClient(helper.socket, owner="pull").pull(image_ref)
    yield helper
    stop_helper(helper)
    shutil.rmtree(base)


@pytest.fixture
def cc(container_helper):
    c = ContainerClient(container_helper.socket, owner=f"t{os.getpid()}")
    yield c
    assert container_helper.proc.poll() is None, "the helper died during the test"
    left = c.list()
    c.release_all()
    c.close()
    assert left == [], f"the test left containers behind: {left}"


def spec(image: str, **kw) -> ContainerSpec:
    base = dict(image=image, cpu=0.5, memory_bytes=128 << 20, pids_max=64)
    base.update(kw)
    return ContainerSpec(**base)


def server_spec(image: str) -> ContainerSpec:
    """A container whose main process answers one line per TCP connection on PORT."""
    return spec(image, command=("perl", "-e", ci.PERL_SERVER, str(PORT)))


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
