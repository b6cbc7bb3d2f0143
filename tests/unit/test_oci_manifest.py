"""Parsing of manifests, configs and the two image files; registry rewriting."""

from __future__ import annotations

import json

import pytest

from camg.errors import ConfigError, DatasetError, PreparationMissing
from camg.oci.images import load_materialized, load_specs, with_registry
from tools.oci import manifest as mf
from tools.oci.digest import check_digest, sha256_bytes
from tools.oci.pull import is_loopback

D1, D2, D3 = ("sha256:" + c * 64 for c in "abc")


def manifest(**over):
    doc = {"schemaVersion": 2, "mediaType": mf.OCI_MANIFEST,
           "config": {"mediaType": mf.OCI_CONFIG, "digest": D1, "size": 10},
           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D2, "size": 5}]}
    doc.update(over)
    return json.dumps(doc).encode()


def test_manifest_round_trip():
    parsed = mf.parse_manifest(manifest(), "m")
    assert parsed.config.digest == D1 and parsed.layers[0].digest == D2


@pytest.mark.parametrize("over,match", [
    ({"schemaVersion": 1}, "schemaVersion"),
    ({"layers": []}, "non-empty"),
    ({"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": D2, "size": 1}]},
     "unsupported layer media type"),
    ({"config": {"mediaType": mf.OCI_CONFIG, "digest": "sha512:" + "a" * 128, "size": 1}}, "sha256 digest"),
    ({"config": {"mediaType": mf.OCI_CONFIG, "digest": D1, "size": -1}}, "non-negative"),
    ({"mediaType": mf.OCI_INDEX}, "not an image manifest"),
])
def test_bad_manifests(over, match):
    with pytest.raises(DatasetError, match=match):
        mf.parse_manifest(manifest(**over), "m")


def test_manifest_bytes_must_match_digest():
    raw = manifest()
    mf.verify_bytes(raw, sha256_bytes(raw), "m")
    with pytest.raises(DatasetError, match="does not match"):
        mf.verify_bytes(raw + b" ", sha256_bytes(raw), "m")


def test_index_selects_linux_amd64():
    index = json.dumps({"schemaVersion": 2, "mediaType": mf.OCI_INDEX, "manifests": [
        {"mediaType": mf.OCI_MANIFEST, "digest": D1, "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": mf.OCI_MANIFEST, "digest": D2, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
    ]}).encode()
    assert mf.media_type_of(index, "i") == mf.OCI_INDEX
    assert mf.select_platform(index, "i") == D2
    with pytest.raises(DatasetError, match="no linux/s390x"):
        mf.select_platform(index, "i", architecture="s390x")


def test_config_diff_ids_and_env():
    raw = json.dumps({"architecture": "amd64", "os": "linux",
                      "config": {"Env": ["PATH=/bin"], "WorkingDir": "/testbed"},
                      "rootfs": {"type": "layers", "diff_ids": [D3]}}).encode()
    config = mf.parse_config(raw, "c")
    assert config.diff_ids == (D3,) and config.env == ("PATH=/bin",) and config.working_dir == "/testbed"
    with pytest.raises(DatasetError, match="diff_ids"):
        mf.parse_config(json.dumps({"architecture": "amd64", "os": "linux",
                                    "rootfs": {"type": "layers", "diff_ids": ["nope"]}}).encode(), "c")
    with pytest.raises(DatasetError, match="not valid JSON"):
        mf.parse_config(b"{", "c")


def test_check_digest():
    assert check_digest(D1, "x") == D1
    for bad in ("sha256:ABC", "md5:" + "a" * 32, "sha256:" + "A" * 64, None):
        with pytest.raises(DatasetError):
            check_digest(bad, "x")


def write(tmp_path, images):
    path = tmp_path / "images.json"
    path.write_text(json.dumps({"version": 1, "images": images}))
    return path


def test_image_list_parses(tmp_path):
    (spec,) = load_specs(write(tmp_path, [{"name": "a/b", "repository": "127.0.0.1:5000/a/b", "digest": D1}]))
    assert spec.workspace == "/testbed"


@pytest.mark.parametrize("image,match", [
    ({"name": "a", "repository": "r/a", "digest": D1, "tag": "latest"}, "unknown field"),
    ({"name": "a", "repository": "r/a", "digest": "sha256:short"}, "sha256 digest"),
    ({"name": "a", "repository": "r/a:latest", "digest": D1}, "registry reference"),
    ({"name": "a", "repository": "r/a", "digest": D1, "workspace": "testbed"}, "absolute path"),
    ({"name": "a", "repository": "r/a", "digest": D1, "workspace": "/a/../b"}, "normalized"),
    ({"name": "", "repository": "r/a", "digest": D1}, "not a valid image name"),
    ({"repository": "r/a", "digest": D1}, "required field"),
])
def test_bad_image_lists(tmp_path, image, match):
    with pytest.raises(ConfigError, match=match):
        load_specs(write(tmp_path, [image]))


def test_duplicate_names_rejected(tmp_path):
    image = {"name": "a", "repository": "r/a", "digest": D1}
    with pytest.raises(ConfigError, match="listed twice"):
        load_specs(write(tmp_path, [image, image]))


def test_product_list_is_valid():
    from pathlib import Path
    load_specs(Path(__file__).resolve().parents[2] / "environments/coding/data/images.json")


def test_with_registry():
    assert with_registry("swebench/x", "127.0.0.1:5000") == "127.0.0.1:5000/swebench/x"
    assert with_registry("docker.io/swebench/x", "127.0.0.1:5000") == "127.0.0.1:5000/swebench/x"
    assert with_registry("localhost:1/a/b", "h:2") == "h:2/a/b"
    assert with_registry("a/b", None) == "a/b"


def test_loopback_detection():
    assert is_loopback("127.0.0.1:5000/a") and is_loopback("localhost:5000/a") and is_loopback("[::1]:5/a")
    assert not is_loopback("registry.example.com/a") and not is_loopback("10.0.0.1:5000/a")


def test_materialized_list_missing_is_a_preparation_step(tmp_path):
    with pytest.raises(PreparationMissing, match="prepare_images.py"):
        load_materialized(tmp_path / "nope.json")


def test_prepare_images_cli_reports_typed_errors(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts/prepare_images.py"
    bad = write(tmp_path, [{"name": "a", "repository": "r/a", "digest": "sha256:nope"}])
    result = subprocess.run([sys.executable, str(script), "--cache-root", str(tmp_path / "c"),
                             "--crane", "crane", "--images", str(bad), "--output", str(tmp_path / "o.json")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "config_error" in result.stderr and "images[0]" in result.stderr and "sha256" in result.stderr
    assert not (tmp_path / "o.json").exists()
    missing_puller = subprocess.run(
        [sys.executable, str(script), "--cache-root", str(tmp_path / "c"), "--skopeo", "/nonexistent/skopeo",
         "--images", str(write(tmp_path, [])), "--output", str(tmp_path / "o.json")],
        capture_output=True, text=True, timeout=60)
    assert missing_puller.returncode == 2 and "--skopeo '/nonexistent/skopeo'" in missing_puller.stderr
