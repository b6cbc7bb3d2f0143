"""The materialized cache: all-or-nothing publication, markers, reuse decisions."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from camg.errors import DatasetError
from tools.oci import cache
from tools.oci.apply import ApplyOptions
from tools.oci.layout import gzip_tar_bytes

OPTIONS = ApplyOptions(chown=os.geteuid() == 0)
DIGEST = "sha256:" + "d" * 64


def tar(*files: tuple[str, bytes], symlinks=()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        for name, target in symlinks:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            out.addfile(info)
    return buf.getvalue()


def verified(tmp_path, *layers: bytes, diff_ids=None) -> cache.VerifiedImage:
    blobs = [gzip_tar_bytes(data, tmp_path / f"l{i}.tgz") for i, data in enumerate(layers)]
    return cache.VerifiedImage(
        name="unit/image", digest=DIGEST, config_digest="sha256:" + "c" * 64,
        diff_ids=tuple(diff_ids or [b.diff_id for b in blobs]),
        layers=tuple((b.digest, "gzip", b.path) for b in blobs), env=("A=1",), working_dir="/testbed")


def materialize(root, image, options=OPTIONS):
    with cache.locked(root), cache.work_dir(root, image.digest) as work:
        return cache.materialize(root, work, image, options, {"name": image.name})


def test_publish_and_marker(tmp_path):
    root = tmp_path / "cache"
    final = materialize(root, verified(tmp_path, tar(("a/b", b"1")), tar(("a/c", b"2"))))
    assert final == cache.image_dir(root, DIGEST)
    assert (final / "rootfs/a/b").read_bytes() == b"1" and (final / "rootfs/a/c").read_bytes() == b"2"
    marker = cache.read_marker(root, DIGEST)
    assert marker["name"] == "unit/image" and marker["env"] == ["A=1"]
    assert [s["files"] for s in marker["layer_stats"]] == [1, 1]
    assert cache.marker_matches(marker, root, DIGEST, OPTIONS)
    assert not cache.marker_matches(marker, root, DIGEST, ApplyOptions(setuid="strip", chown=OPTIONS.chown))
    assert not cache.marker_matches(marker, root, "sha256:" + "e" * 64, OPTIONS)
    assert list((root / "tmp").iterdir()) == []


def test_diff_id_mismatch_publishes_nothing(tmp_path):
    root = tmp_path / "cache"
    image = verified(tmp_path, tar(("a", b"1")), diff_ids=["sha256:" + "0" * 64])
    with pytest.raises(DatasetError, match=r"uncompresses to sha256:\w+, but the config's diff_ids\[0\]"):
        materialize(root, image)
    assert not cache.image_dir(root, DIGEST).exists()
    assert list((root / "tmp").iterdir()) == []


def test_rejection_in_a_later_layer_publishes_nothing(tmp_path):
    root = tmp_path / "cache"
    image = verified(tmp_path, tar(("ok", b"1")), tar(("../escape", b"2")))
    with pytest.raises(DatasetError, match=r"layer sha256:\w+ rejected at entry '../escape'") as info:
        materialize(root, image)
    assert info.value.details["layer"] == image.layers[1][0]
    assert not cache.image_dir(root, DIGEST).exists()
    assert list((root / "tmp").iterdir()) == [] and not (tmp_path / "escape").exists()


def test_corrupt_gzip_is_a_dataset_error(tmp_path):
    root = tmp_path / "cache"
    image = verified(tmp_path, tar(("a", b"1" * 10000)))
    path = image.layers[0][2]
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DatasetError, match="not a valid tar stream"):
        materialize(root, image)
    assert not cache.image_dir(root, DIGEST).exists()


def test_rematerialize_replaces_outdated_entry(tmp_path):
    root = tmp_path / "cache"
    materialize(root, verified(tmp_path, tar(("v", b"old"))))
    strip = ApplyOptions(setuid="strip", chown=OPTIONS.chown)
    final = materialize(root, verified(tmp_path, tar(("v", b"new"))), strip)
    assert (final / "rootfs/v").read_bytes() == b"new"
    assert cache.read_marker(root, DIGEST)["setuid_policy"] == "strip"
    assert list((root / "tmp").iterdir()) == []


def test_stale_work_dirs_are_swept_and_removal_is_idempotent(tmp_path):
    root = tmp_path / "cache"
    (root / "tmp" / "crashed.123" / "image").mkdir(parents=True)
    with cache.locked(root):
        assert list((root / "tmp").iterdir()) == []
    materialize(root, verified(tmp_path, tar(("x", b"1"))))
    assert cache.cached_digests(root) == (DIGEST,)
    cache.remove_image(root, DIGEST)
    cache.remove_image(root, DIGEST)
    assert cache.cached_digests(root) == ()


def test_the_cache_seen_at_another_path_is_still_complete(tmp_path):
    """The system tier's guests bind the host's cache at another path: an
    entry applied there is reused, not applied again over the tree in use."""
    root = tmp_path / "cache"
    materialize(root, verified(tmp_path, tar(("a/b", b"1"))))
    elsewhere = tmp_path / "seen-elsewhere"
    root.rename(elsewhere)
    marker = cache.read_marker(elsewhere, DIGEST)
    assert not Path(marker["rootfs"]).exists()  # where it was applied
    assert cache.marker_matches(marker, elsewhere, DIGEST, OPTIONS)
    (cache.image_dir(elsewhere, DIGEST) / "rootfs").rename(elsewhere / "gone")
    assert not cache.marker_matches(marker, elsewhere, DIGEST, OPTIONS)


def test_broken_marker_is_not_trusted(tmp_path):
    root = tmp_path / "cache"
    final = materialize(root, verified(tmp_path, tar(("x", b"1"))))
    (final / "complete.json").write_text("{not json")
    assert cache.read_marker(root, DIGEST) is None
    (final / "complete.json").write_text(json.dumps({"digest": DIGEST}))
    assert not cache.marker_matches(cache.read_marker(root, DIGEST), root, DIGEST, OPTIONS)
