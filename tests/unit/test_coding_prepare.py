"""camg.prepare --environment coding: selection, mirror identity, manifest."""

import json
import subprocess
import sys

import pytest

from camg.config import task_manifest as manifest
from camg.errors import ConfigError, DatasetError, PreparationMissing
from camg.oci.images import MaterializedImage, write_materialized
from camg.prepare import main
from environments.coding.prepare import prepare_coding
from environments.coding import layers, mirrors, rows
from environments.coding.prepare_layers import build_layers_as_root
from environments.coding.checks import synthetic

IMAGE = "camg/demo-apispec-6.8.1"


@pytest.fixture(scope="module")
def task_set():
    return synthetic.task_set(sys.executable)


@pytest.fixture
def images(tmp_path):
    rootfs = tmp_path / "img" / "rootfs"
    rootfs.mkdir(parents=True)
    digest = "sha256:" + "a" * 64
    (rootfs.parent / "complete.json").write_text(json.dumps({"digest": digest,
                                                             "rootfs": str(rootfs)}))
    image = MaterializedImage(name=IMAGE, repository="127.0.0.1:5000/camg/demo-apispec",
                              digest=digest, config_digest="sha256:" + "b" * 64, diff_ids=(),
                              rootfs=str(rootfs), workspace="/testbed", env=(),
                              working_dir="/testbed", setuid_policy="keep",
                              hash="sha256:" + "c" * 64)
    path = tmp_path / "materialized-images.json"
    write_materialized(path, (image,))
    return path


def load_rows(task_set):
    return [json.loads(line) for line in (task_set / "tasks.jsonl").read_text().splitlines()]


def prep(task_set, images, tmp_path, rows_path=None, **kwargs):
    out = tmp_path / "manifest.json"
    prepare_coding(rows_path=rows_path or task_set / "tasks.parquet",
                   mirrors_root=kwargs.pop("mirrors_root", task_set / "mirrors"),
                   images_path=images, output=out, layers_root=None, **kwargs)
    return manifest.load(out)


def test_manifest_keeps_rows_order_and_records_commits(task_set, images, tmp_path):
    loaded = prep(task_set, images, tmp_path, seed=7)
    source = load_rows(task_set)
    assert loaded.task_ids == [r["instance_id"] for r in source]
    assert loaded.sampling == {"order": "rows", "seed": 7, "limit": None, "select_sha256": None}
    for task, row in zip(loaded.tasks, source):
        ref = task.data["mirror"]
        assert ref["branch"] == row["instance_id"]
        assert mirrors.git(ref["mirror"], "rev-parse", row["instance_id"]).strip() == ref["tip"]
        assert mirrors.git(ref["mirror"], "rev-parse", ref["tip"] + "~1").strip() == ref["tests"]
        assert task.data["image"]["name"] == IMAGE
        assert task.data["FAIL_TO_PASS"] == row["FAIL_TO_PASS"]
    assert set(loaded.files) == {"rows", "images"}
    loaded.verify_files()


def test_selection_keeps_given_ids_and_order(task_set, images, tmp_path):
    ids = [r["instance_id"] for r in load_rows(task_set)]
    chosen = [ids[2], ids[0], ids[3]]
    select = tmp_path / "ids.txt"
    select.write_text("# served in this order\n" + "\n".join(chosen) + "\n")
    loaded = prep(task_set, images, tmp_path, select=select, limit=2)
    assert loaded.task_ids == chosen[:2]
    assert loaded.sampling["order"] == "select" and loaded.sampling["limit"] == 2
    select.write_text(ids[0] + "\nnot-a-task\n")
    with pytest.raises(DatasetError, match="'not-a-task' is not in"):
        prep(task_set, images, tmp_path, select=select)
    select.write_text(ids[0] + "\n" + ids[0] + "\n")
    with pytest.raises(DatasetError, match="selected twice"):
        prep(task_set, images, tmp_path, select=select)


def test_bad_row_names_index_and_field(task_set, images, tmp_path):
    data = load_rows(task_set)
    data[1]["PASS_TO_PASS"] = "nope"
    bad = tmp_path / "rows.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match=r"row 1 \('.*'\): field PASS_TO_PASS"):
        prep(task_set, images, tmp_path, rows_path=bad)
    data = load_rows(task_set)
    data.append(dict(data[0]))
    bad.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match="appears twice"):
        prep(task_set, images, tmp_path, rows_path=bad)


def test_missing_branch_mirror_or_image_is_rejected(task_set, images, tmp_path):
    data = load_rows(task_set)
    data[0]["instance_id"] = data[0]["instance_id"] + "x"
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match="has no branch named"):
        prep(task_set, images, tmp_path, rows_path=path)
    data = load_rows(task_set)
    data[0]["repo"] = "camg-demo/elsewhere"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match="no mirror directory"):
        prep(task_set, images, tmp_path, rows_path=path)
    data = load_rows(task_set)
    data[0]["image_name"] = "camg/unknown"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match="not materialized"):
        prep(task_set, images, tmp_path, rows_path=path)


def test_conflicting_identity_is_rejected(task_set, images, tmp_path):
    data = load_rows(task_set)
    owner, name = data[1]["repo"].split("/")
    data[1]["repo"] = f"someone-else/{name}"
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DatasetError, match="both claim mirror"):
        prep(task_set, images, tmp_path, rows_path=path)


def test_branch_without_parent_is_rejected(task_set, images, tmp_path):
    copy = tmp_path / "mirrors"
    subprocess.run(["cp", "-a", str(task_set / "mirrors"), str(copy)], check=True)
    (mirror,) = copy.iterdir()
    first = load_rows(task_set)[0]["instance_id"]
    subprocess.run(["git", "-C", str(mirror), "checkout", "-q", "--orphan", "orphan"], check=True)
    subprocess.run(["git", "-C", str(mirror), "-c", "user.name=x", "-c", "user.email=x@x",
                    "commit", "-q", "-m", "orphan"], check=True)
    subprocess.run(["git", "-C", str(mirror), "branch", "-f", first, "orphan"], check=True)
    with pytest.raises(DatasetError, match="has no parent commit"):
        prep(task_set, images, tmp_path, mirrors_root=copy)


def test_unprivileged_layers_build_and_verify(task_set, tmp_path):
    task_rows = [rows.validate(r, i) for i, r in enumerate(load_rows(task_set))]
    (ref,) = mirrors.resolve(task_set / "mirrors", task_rows[:1])
    built = build_layers_as_root(tmp_path, ref, privileged=False)
    again = layers.verified(tmp_path, ref, privileged=False)
    assert built == again == build_layers_as_root(tmp_path, ref, privileged=False)
    with pytest.raises(ConfigError, match="rebuild"):
        layers.verified(tmp_path, ref, privileged=True)
    moved = mirrors.TaskRef(ref.mirror, ref.branch, ref.tip, ref.tip)
    other = tmp_path / "other"
    with pytest.raises(PreparationMissing, match="missing") as missing:
        layers.verified(other, moved, privileged=False)
    # The service's refusal names the command that builds them.
    assert missing.value.step == layers.PREPARE_STEP
    assert not other.exists()


def test_cli_reports_errors_and_writes(task_set, images, tmp_path, capsys):
    out = tmp_path / "m.json"
    args = ["--environment", "coding", "--rows", str(task_set / "tasks.jsonl"),
            "--mirrors-root", str(task_set / "mirrors"), "--images", str(images),
            "--output", str(out), "--no-layers", "--limit", "2"]
    assert main(args) == 0 and len(manifest.load(out).tasks) == 2
    assert main([*args[:-2], "--limit", "0"]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err


def test_swesmith_image_names_match_their_docker_hub_spelling(tmp_path):
    from environments.coding import images as images_mod
    rootfs = tmp_path / "img" / "rootfs"
    rootfs.mkdir(parents=True)
    digest = "sha256:" + "d" * 64
    (rootfs.parent / "complete.json").write_text(json.dumps({"digest": digest,
                                                             "rootfs": str(rootfs)}))
    hub = "swebench/swesmith.x86_64.pandas-dev_1776_pandas.95280573"
    image = MaterializedImage(name=hub, repository="127.0.0.1:5000/swebench/x", digest=digest,
                              config_digest=digest, diff_ids=(), rootfs=str(rootfs),
                              workspace="/testbed", env=(), working_dir="/testbed",
                              setuid_policy="keep", hash="sha256:" + "e" * 64)
    path = tmp_path / "m.json"
    write_materialized(path, (image,))
    catalog = images_mod.load(path)
    assert images_mod.lookup(catalog, "swesmith.x86_64.pandas-dev__pandas.95280573").name == hub
    with pytest.raises(DatasetError, match="not materialized"):
        images_mod.lookup(catalog, "swesmith.x86_64.other__thing.00000000")


def test_plain_clone_with_remote_tracking_branches_is_refused_with_the_fix(task_set, images,
                                                                             tmp_path, capsys):
    """A plain `git clone` of a mirror has the task branches only under
    refs/remotes/origin/: refused, saying so and how to fix it."""
    (mirror,) = (task_set / "mirrors").iterdir()
    clones = tmp_path / "clones"
    subprocess.run(["git", "clone", "-q", str(mirror), str(clones / mirror.name)], check=True,
                   capture_output=True)
    with pytest.raises(DatasetError, match="remote-tracking ref refs/remotes/origin/") as info:
        prep(task_set, images, tmp_path, mirrors_root=clones)
    assert "git clone --mirror" in str(info.value)
    args = ["--environment", "coding", "--rows", str(task_set / "tasks.jsonl"),
            "--mirrors-root", str(clones), "--images", str(images),
            "--output", str(tmp_path / "m.json"), "--no-layers"]
    assert main(args) == 2
    assert "git clone --mirror" in capsys.readouterr().err


def test_service_start_refuses_missing_layers_and_builds_none(task_set, images, tmp_path):
    """Task layers are built only by preparation (as root): the service,
    even started as root, checks them and names the command when one is
    missing, without writing anything under layers_root."""
    from camg.environment import ServiceContext
    from environments.coding.environment import CodingEnvironment
    loaded = prep(task_set, images, tmp_path)
    layers_root = tmp_path / "layers"
    env = CodingEnvironment(ServiceContext("coding", str(tmp_path / "state"), {
        "mirrors_root": str(task_set / "mirrors"), "images": str(images),
        "layers_root": str(layers_root)}), loaded.tasks)
    with pytest.raises(PreparationMissing, match="task layers are missing") as missing:
        env.start()
    assert missing.value.step == layers.PREPARE_STEP
    assert not layers_root.exists()
