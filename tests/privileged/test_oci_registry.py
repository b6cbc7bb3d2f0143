"""prepare_images.py against a real docker-registry on loopback: good and malicious images."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oci_fixtures import (  # noqa: E402
    leftovers, publish, registry, run_prepare, tar_bytes, tar_entry, write_images)

from camg.oci.images import load_materialized  # noqa: E402
from tools.oci import manifest as mf  # noqa: E402
from tools.oci.digest import hex_of  # noqa: E402

pytestmark = pytest.mark.privileged
_ = registry  # the fixture, imported for pytest to find

OUTSIDE = "/tmp/camg-oci-test-outside"

GOOD_BASE = tar_bytes(
    tar_entry("etc/", "dir"),
    tar_entry("etc/os-release", data=b"ID=camgtest\n"),
    tar_entry("usr/bin/sudo", data=b"#!/bin/sh\n", mode=0o4755),
    tar_entry("usr/bin/sudoedit", "hardlink", linkname="usr/bin/sudo"),
    tar_entry("bin", "symlink", linkname="usr/bin"),
    tar_entry("etc/alternatives/editor", "symlink", linkname="/usr/bin/sudo"),
    tar_entry("home/agent/", "dir", uid=2000, gid=2000, mode=0o750),
    tar_entry("home/agent/.profile", data=b"# hi\n", uid=2000, gid=2000),
    tar_entry("dev/null", "chr"),
    tar_entry("old/a", data=b"a"),
    tar_entry("old/b", data=b"b"),
    tar_entry("gone", data=b"x"),
    tar_entry("testbed/", "dir"),
)
GOOD_TOP = tar_bytes(
    tar_entry(".wh.gone"),
    tar_entry("old/.wh..wh..opq"),
    tar_entry("old/c", data=b"c"),
)

MALICIOUS = {
    "dotdot": [tar_bytes(tar_entry("../../../tmp/camg-oci-test-outside/pwned", data=b"x"))],
    "absolute": [tar_bytes(tar_entry(f"{OUTSIDE}/pwned", data=b"x"))],
    "abs-symlink-write": [tar_bytes(tar_entry("evil", "symlink", linkname=OUTSIDE)),
                          tar_bytes(tar_entry("evil/pwned", data=b"x"))],
    "rel-symlink-escape": [tar_bytes(tar_entry("a/b/evil", "symlink",
                                               linkname="../../../../../../tmp/camg-oci-test-outside"))],
    "hardlink-escape": [tar_bytes(tar_entry("stolen", "hardlink", linkname="../../etc/shadow"))],
    "hardlink-via-symlink": [tar_bytes(tar_entry("evil", "symlink", linkname=OUTSIDE),
                                       tar_entry("stolen", "hardlink", linkname="evil/keep"))],
    "whiteout-outside": [tar_bytes(tar_entry("evil", "symlink", linkname=OUTSIDE)),
                         tar_bytes(tar_entry("evil/.wh.keep"))],
}


@pytest.fixture
def outside():
    path = Path(OUTSIDE)
    path.mkdir(exist_ok=True)
    (path / "keep").write_text("keep me")
    yield path
    assert sorted(p.name for p in path.iterdir()) == ["keep"], "a layer wrote outside its root"
    assert (path / "keep").read_text() == "keep me"
    (path / "keep").unlink()
    path.rmdir()


def test_good_image_materializes_then_is_reused(registry, tmp_path):
    digest, layers = publish(registry, tmp_path / "good", "camg-test/good", [GOOD_BASE, GOOD_TOP])
    images = write_images(tmp_path / "images.json", [{
        "name": "camg-test/good", "repository": "example.invalid/camg-test/good",
        "digest": digest, "workspace": "/testbed"}])
    cache_root, output = tmp_path / "cache", tmp_path / "materialized.json"

    first = run_prepare(cache_root, images, output, "--registry", registry.address, "--skopeo", "skopeo")
    assert first.returncode == 0, first.stderr
    assert "materialized" in first.stderr
    listing = load_materialized(output)
    (image,) = listing.images
    rootfs = Path(image.rootfs)
    assert rootfs == cache_root / "images" / hex_of(digest) / "rootfs"
    assert image.repository == f"{registry.address}/camg-test/good"
    assert image.diff_ids == tuple(layer.diff_id for layer in layers)
    assert (image.workspace, image.working_dir, image.env) == ("/testbed", "/testbed", ("PATH=/usr/bin:/bin",))
    assert image.hash.startswith("sha256:") and listing.hash.startswith("sha256:")

    # The tree, with ownership and modes from the tar headers.
    assert (rootfs / "etc/os-release").read_text() == "ID=camgtest\n"
    assert sorted(p.name for p in (rootfs / "old").iterdir()) == ["c"]
    assert not (rootfs / "gone").exists() and not (rootfs / "dev/null").exists()
    sudo = (rootfs / "usr/bin/sudo").stat()
    assert (stat.S_IMODE(sudo.st_mode), sudo.st_uid) == (0o4755, 0)
    assert (rootfs / "usr/bin/sudoedit").stat().st_ino == sudo.st_ino
    assert os.readlink(rootfs / "bin") == "usr/bin"
    agent = (rootfs / "home/agent").stat()
    assert (agent.st_uid, agent.st_gid, stat.S_IMODE(agent.st_mode)) == (2000, 2000, 0o750)
    assert rootfs.stat().st_uid == 0 and stat.S_IMODE(rootfs.stat().st_mode) == 0o755
    marker = json.loads((rootfs.parent / "complete.json").read_text())
    assert marker["layers"] == [layer.digest for layer in layers]
    assert leftovers(cache_root) == []

    # Second run: verified cache reused, nothing pulled, same record.
    inode = (rootfs / "etc/os-release").stat().st_ino
    registry_down = run_prepare(cache_root, images, tmp_path / "again.json", "--registry", "127.0.0.1:9",
                                "--skopeo", "skopeo")
    assert registry_down.returncode == 0, registry_down.stderr
    assert "reused" in registry_down.stderr
    assert (rootfs / "etc/os-release").stat().st_ino == inode
    assert load_materialized(tmp_path / "again.json").hash == listing.hash

    # Strip policy: a different materialization of the same digest.
    stripped = run_prepare(cache_root, images, output, "--registry", registry.address,
                           "--setuid-policy", "strip")
    assert stripped.returncode == 0, stripped.stderr
    assert stat.S_IMODE((rootfs / "usr/bin/sudo").stat().st_mode) == 0o755
    assert load_materialized(output).hash != listing.hash
    assert leftovers(cache_root) == []


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_images_are_rejected_without_leftovers(registry, tmp_path, outside, case):
    digest, layers = publish(registry, tmp_path / case, f"camg-test/{case}", MALICIOUS[case])
    images = write_images(tmp_path / "images.json", [{
        "name": f"camg-test/{case}", "repository": f"{registry.address}/camg-test/{case}",
        "digest": digest}])
    cache_root = tmp_path / "cache"
    result = run_prepare(cache_root, images, tmp_path / "out.json", "--skopeo", "skopeo")
    assert result.returncode == 2
    assert "dataset_error" in result.stderr
    assert f"image camg-test/{case}" in result.stderr
    assert any(layer.digest in result.stderr for layer in layers), result.stderr
    assert "rejected at entry" in result.stderr
    assert not (tmp_path / "out.json").exists()
    assert not (cache_root / "images" / hex_of(digest)).exists()
    assert leftovers(cache_root) == []


def test_config_lying_about_diff_ids_is_rejected(registry, tmp_path):
    digest, layers = publish(registry, tmp_path / "liar", "camg-test/liar", [GOOD_BASE],
                             diff_ids=["sha256:" + "0" * 64])
    images = write_images(tmp_path / "images.json", [{
        "name": "liar", "repository": f"{registry.address}/camg-test/liar", "digest": digest}])
    result = run_prepare(tmp_path / "cache", images, tmp_path / "out.json", "--skopeo", "skopeo")
    assert result.returncode == 2
    assert f"layer {layers[0].digest} uncompresses to {layers[0].diff_id}" in result.stderr
    assert leftovers(tmp_path / "cache") == [] and not (tmp_path / "cache/images" / hex_of(digest)).exists()


def test_tampered_blob_in_registry_is_rejected(registry, tmp_path):
    digest, layers = publish(registry, tmp_path / "tamper", "camg-test/tamper", [GOOD_BASE])
    data = (registry.state_dir / "storage/docker/registry/v2/blobs/sha256"
            / hex_of(layers[0].digest)[:2] / hex_of(layers[0].digest) / "data")
    original = data.read_bytes()
    data.write_bytes(original[:-8] + b"\0" * 8)
    try:
        images = write_images(tmp_path / "images.json", [{
            "name": "tamper", "repository": f"{registry.address}/camg-test/tamper", "digest": digest}])
        result = run_prepare(tmp_path / "cache", images, tmp_path / "out.json", "--skopeo", "skopeo")
    finally:
        data.write_bytes(original)
    assert result.returncode == 2
    assert "dataset_error" in result.stderr and "tamper" in result.stderr
    assert leftovers(tmp_path / "cache") == []


def test_wrong_digest_is_not_found(registry, tmp_path):
    images = write_images(tmp_path / "images.json", [{
        "name": "missing", "repository": f"{registry.address}/camg-test/good", "digest": "sha256:" + "1" * 64}])
    result = run_prepare(tmp_path / "cache", images, tmp_path / "out.json", "--skopeo", "skopeo")
    assert result.returncode == 2
    assert "sha256:" + "1" * 64 in result.stderr
    assert leftovers(tmp_path / "cache") == []


@pytest.mark.parametrize("form", ["index", "docker-v2s2"])
def test_index_and_docker_manifests(registry, tmp_path, form):
    """Images listed by an index digest (multi-platform) or stored as Docker v2 schema 2
    (what `docker push` and Docker Hub's SWE-smith images use) materialize the same tree."""
    digest, layers = publish(registry, tmp_path / form, f"camg-test/{form}", [GOOD_BASE, GOOD_TOP],
                             index=form == "index", docker_format=form == "docker-v2s2")
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{registry.address}/camg-test/{form}@{digest}"],
                         capture_output=True, check=True).stdout
    expected = {"index": mf.OCI_INDEX, "docker-v2s2": mf.DOCKER_MANIFEST}[form]
    assert json.loads(raw)["mediaType"] == expected
    images = write_images(tmp_path / "images.json", [{
        "name": form, "repository": f"{registry.address}/camg-test/{form}", "digest": digest}])
    result = run_prepare(tmp_path / "cache", images, tmp_path / "out.json", "--skopeo", "skopeo")
    assert result.returncode == 0, result.stderr
    (image,) = load_materialized(tmp_path / "out.json").images
    assert image.digest == digest
    assert image.diff_ids == tuple(layer.diff_id for layer in layers)
    rootfs = Path(image.rootfs)
    assert (rootfs / "etc/os-release").read_text() == "ID=camgtest\n"
    assert sorted(p.name for p in (rootfs / "old").iterdir()) == ["c"]
