"""``python -m camg.prepare_shop``: the outputs it records, its verify mode,
MemoryArena-style rows on an existing index, and its refusals."""

import json
import shutil
import subprocess
import sys

import pytest

from camg.config import task_manifest as manifest
from camg.config.hashing import sha256_path
from environments.shop import store
from environments.shop.store import ProductStore
from tests.support import shop_testing as testing


def run(*args):
    return subprocess.run([sys.executable, "-m", "camg.prepare_shop", *args], cwd=testing.REPO,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def prepared():
    return testing.prepared()


def test_outputs_and_recorded_hashes(prepared):
    out, settings = prepared
    loaded = manifest.load(out / "manifest.json")
    assert loaded.environment == "shop" and len(loaded.tasks) == 6910
    assert loaded.files["product_pool"]["sha256"] == settings["product_pool_sha256"] \
        == sha256_path(out / "product_pool.sqlite")
    assert loaded.files["index"]["sha256"] == settings["index_sha256"] == sha256_path(out / "index")
    assert loaded.sampling["goal_seed"] == settings["goal_seed"] == 0
    assert loaded.sampling["splits"] == {"test": [0, 500], "eval": [500, 1500], "train": [1500, None]}
    assert [t.data["goal_index"] for t in loaded.tasks[:3]] == [0, 1, 2]
    docs = (out / "collection/documents.jsonl").read_text().splitlines()
    first = json.loads(docs[0])
    assert set(first) == {"id", "contents", "product"} and first["contents"] == first["contents"].lower()
    assert sorted((out / "index").iterdir())  # a Lucene index with segments
    assert any(p.name.startswith("segments_") for p in (out / "index").iterdir())


def test_verify_detects_a_changed_pool(prepared, tmp_path):
    out, _ = prepared
    copy = tmp_path / "prep"
    shutil.copytree(out, copy, symlinks=True)
    body = json.loads((copy / "manifest.json").read_text())
    for entry in body["files"].values():
        entry["path"] = entry["path"].replace(str(out), str(copy))
    (copy / "manifest.json").write_text(json.dumps(body))
    pool = list(ProductStore(copy / "product_pool.sqlite").values())
    pool[3]["Price"] = "$0.01"
    store.write_store(pool, copy / "product_pool.sqlite")
    proc = run("--output", str(copy), "--verify")
    assert proc.returncode == 2
    assert "product_pool" in proc.stderr and "changed since preparation" in proc.stderr


def test_exact_product_rows_on_an_existing_index(prepared, tmp_path):
    out, settings = prepared
    product = next(p for p in ProductStore(settings["product_pool"]).values() if p["options"])
    name, values = next(iter(product["options"].items()))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"task_id": "ma-1", "instruction": "buy the thing",
                                "target_asin": product["asin"],
                                "attributes": {name: values[0]}}) + "\n")
    target = tmp_path / "exact"
    proc = run("--output", str(target), "--java-home", settings["java_home"],
               "--index-dir", settings["index_dir"], "--goals", "synthetic", "--splits", "test",
               "--exact-product-rows", str(rows), "--sample-index-check", "--jvm-heap-mb", "256")
    assert proc.returncode == 0, proc.stderr
    loaded = manifest.load(target / "manifest.json")
    assert len(loaded.tasks) == 501 and loaded.tasks[-1].task_id == "ma-1"
    assert loaded.tasks[-1].data["target_options"] == {name: values[0]}
    assert {t.data["split"] for t in loaded.tasks[:-1]} == {"test"}
    # the existing index is used in place, not copied or rebuilt
    assert loaded.files["index"]["path"] == settings["index_dir"]
    assert loaded.files["index"]["sha256"] == settings["index_sha256"]


def test_refusals(tmp_path, prepared):
    proc = run("--output", str(tmp_path / "x"))
    assert proc.returncode == 2 and "--java-home is required" in proc.stderr
    proc = run("--output", str(tmp_path / "y"), "--java-home", "/usr/lib/jvm/java-17-openjdk-amd64",
               "--index-dir", prepared[1]["index_dir"])
    assert proc.returncode == 2 and "Conda-style" in proc.stderr
    bad_rows = tmp_path / "rows.jsonl"
    bad_rows.write_text(json.dumps({"instruction": "x", "target_asin": "B000000000"}) + "\n")
    proc = run("--output", str(tmp_path / "z"), "--java-home", prepared[1]["java_home"],
               "--index-dir", prepared[1]["index_dir"], "--goals", "none",
               "--exact-product-rows", str(bad_rows), "--sample-index-check")
    assert proc.returncode == 2 and "not in the product pool" in proc.stderr
