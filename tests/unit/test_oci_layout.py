"""The layer writer and layout: what it writes, the applier reads back identically."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile

from camg.config.hashing import sha256_tree
from tools.oci import layout
from tools.oci import manifest as mf
from tools.oci.cache import VerifiedImage, locked, materialize, work_dir
from tools.oci.apply import ApplyOptions
from tools.oci.digest import file_digest, hex_of


def make_tree(root):
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_text("#!/bin/sh\n")
    os.chmod(root / "usr/bin/tool", 0o755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool-again")
    os.symlink("usr/bin", root / "bin")
    os.symlink("/etc/missing", root / "dangling")
    (root / "empty").mkdir()
    (root / "dev").mkdir()
    os.mkfifo(root / "dev/fifo")


def test_layer_digests_and_round_trip(tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    layer = layout.layer_from_tree(src, tmp_path / "layer.tar.gz")
    assert file_digest(layer.path) == (layer.digest, layer.size)
    raw = gzip.decompress(layer.path.read_bytes())
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == layer.diff_id
    with tarfile.open(layer.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members)  # deterministic order
    assert members["usr/bin/tool-again"].islnk() and "dev/fifo" not in members
    assert all(m.uname == "" for m in members.values())

    image = VerifiedImage("unit/round-trip", "sha256:" + "f" * 64, "sha256:" + "e" * 64, (layer.diff_id,),
                          ((layer.digest, "gzip", layer.path),), (), "")
    root = tmp_path / "cache"
    with locked(root), work_dir(root, image.digest) as work:
        final = materialize(root, work, image, ApplyOptions(chown=os.geteuid() == 0), {})
    os.unlink(src / "dev/fifo")
    assert sha256_tree(final / "rootfs") == sha256_tree(src)
    assert (final / "rootfs/usr/bin/tool").stat().st_ino == (final / "rootfs/usr/bin/tool-again").stat().st_ino


def test_layer_of_selected_subtrees(tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    layer = layout.layer_from_tree(src, tmp_path / "l.tgz", include=("usr/bin", "empty"),
                                   exclude=("usr/bin/tool-again",))
    with tarfile.open(layer.path) as tar:
        assert tar.getnames() == ["empty", "usr/bin", "usr/bin/tool"]


def test_layout_is_a_valid_oci_image(tmp_path):
    layer = layout.gzip_tar_bytes(b"\0" * 1024, tmp_path / "empty.tgz")
    config = layout.image_config([layer], env=["A=1"], working_dir="/testbed")
    digest = layout.write_layout(tmp_path / "oci", [layer], config, "t")
    blobs = tmp_path / "oci/blobs/sha256"
    raw = (blobs / hex_of(digest)).read_bytes()
    mf.verify_bytes(raw, digest, "manifest")
    parsed = mf.parse_manifest(raw, "manifest")
    assert parsed.layers[0].digest == layer.digest
    parsed_config = mf.parse_config((blobs / hex_of(parsed.config.digest)).read_bytes(), "config")
    assert parsed_config.diff_ids == (layer.diff_id,)
    index = json.loads((tmp_path / "oci/index.json").read_text())
    assert index["manifests"][0]["digest"] == digest
    # Same inputs, same digest: the config pins its timestamps.
    assert layout.write_layout(tmp_path / "oci2", [layer], config, "t") == digest
