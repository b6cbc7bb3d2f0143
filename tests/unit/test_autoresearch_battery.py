"""AutoResearch's no-learning battery: ``prepare --validate`` refuses a task
that pays for no learning, through the grader's own scoring, and accepts one
no baseline can beat; the demo's segmentation data is out of the battery's
reach while MONAI-style constant-intensity discs are not."""

from __future__ import annotations

import csv
import json
import types
from pathlib import Path

import numpy as np
import pytest

from camg.errors import DatasetError
from environments.autoresearch import battery, grader, validate
from environments.autoresearch.demo import synthetic


def _table(path: Path, head: list[str], rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(rows)


def tabular_bundle(source: Path, task_id: str, *, copyable: bool) -> Path:
    """A classification task scored by accuracy between 0.5 and 1.0. Its
    label is the sign of x1*x2 (no single column, constant or neighbour gives
    it); ``copyable`` adds a column that is the label itself."""
    rng = np.random.default_rng(7)
    n = 400
    x = rng.normal(size=(n, 3))
    y = (x[:, 0] * x[:, 1] > 0).astype(int)
    if copyable:
        x[:, 2] = y
    ids = [f"r{i:04d}" for i in rng.permutation(n)]
    bundle = source / task_id
    for d in ("public", "private"):
        (bundle / d).mkdir(parents=True)
    train, test = range(280), range(280, n)
    _table(bundle / "public" / "train.csv", ["id", "a", "b", "c", "target"],
           ([ids[i], *x[i], y[i]] for i in train))
    _table(bundle / "public" / "test.csv", ["id", "a", "b", "c"], ([ids[i], *x[i]] for i in test))
    _table(bundle / "private" / "answers.csv", ["id", "target"], ([ids[i], y[i]] for i in test))
    (bundle / "private" / "scoring.json").write_text(json.dumps(
        {"metric": "accuracy", "baseline_score": 0.5, "reference_score": 1.0}))
    return bundle


def image_bundle(source: Path, task_id: str, images: np.ndarray, masks: np.ndarray,
                 baseline: float, reference: float) -> Path:
    bundle = source / task_id
    for d in ("public", "private"):
        (bundle / d).mkdir(parents=True)
    n_train = len(images) * 2 // 3
    np.save(bundle / "public" / "train_images.npy", images[:n_train])
    np.save(bundle / "public" / "train_masks.npy", masks[:n_train])
    np.save(bundle / "public" / "test_images.npy", images[n_train:])
    _table(bundle / "private" / "answers.csv", ["id", "target"],
           ([f"sg{n:02d}_{p:04d}", int(v)] for n, m in enumerate(masks[n_train:])
            for p, v in enumerate(m.ravel())))
    (bundle / "private" / "scoring.json").write_text(json.dumps(
        {"metric": "dice", "baseline_score": baseline, "reference_score": reference}))
    return bundle


def constant_discs(entropy: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """What MONAI's create_test_image_2d makes: discs of one intensity each
    under noise drawn once per image and added to the background only."""
    images, masks = [], []
    for rng in synthetic.streams(entropy, n):
        yy, xx = np.mgrid[:32, :32]
        image = rng.uniform(0, 0.6, (32, 32))
        mask = np.zeros((32, 32), np.uint8)
        for _ in range(3):
            cy, cx, r = rng.uniform(6, 26), rng.uniform(6, 26), rng.uniform(3, 6)
            inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
            image[inside], mask[inside] = rng.uniform(0.3, 1.0), 1
        images.append(image.astype(np.float32))
        masks.append(mask)
    return np.array(images), np.array(masks)


def run_validate(source: Path, tmp_path: Path, chosen: list[str]) -> dict:
    """validate() without a helper: the leak scan over an empty "image" and
    the battery, the public files read from where preparation installs them."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    workspaces = tmp_path / "workspaces"
    for task_id in chosen:
        dest = workspaces / task_id / "task"
        if not dest.exists():
            dest.parent.mkdir(parents=True)
            dest.symlink_to(source / task_id / "public")
    return validate.validate(chosen, source, workspaces, types.SimpleNamespace(rootfs=rootfs),
                             None)


def test_labels_copyable_from_the_inputs_are_refused_naming_baseline_score_and_limit(tmp_path):
    source = tmp_path / "bundles"
    tabular_bundle(source, "leaky", copyable=True)
    with pytest.raises(DatasetError) as refused:
        run_validate(source, tmp_path, ["leaky"])
    message = str(refused.value)
    assert "leaky" in message and "identity_column" in message
    assert "scores 1, reward 1.0000 > 0.1" in message


def test_a_task_no_baseline_can_beat_passes_and_reports_every_baseline(tmp_path):
    source = tmp_path / "bundles"
    tabular_bundle(source, "xor", copyable=False)
    record = run_validate(source, tmp_path, ["xor"])
    found = record["tasks"]["xor"]["battery"]
    assert {"constant_0", "constant_1", "majority", "mean", "median", "identity_column",
            "nearest_id", "row_order"} <= set(found)
    assert max(row["reward"] for row in found.values()) <= battery.LIMIT
    assert "paid_without_learning" not in record["tasks"]["xor"]


def test_constant_intensity_discs_are_refused_by_repeats_and_filters(tmp_path):
    # The first segmentation task: a filter and a threshold, or the pixels
    # whose exact value repeats, earned nearly all of the reward.
    source = tmp_path / "bundles"
    images, masks = constant_discs(11, 24)
    image_bundle(source, "discs", images, masks, baseline=0.3, reference=0.99)
    found = validate.no_learning(source / "discs" / "public", source / "discs" / "private")
    assert found["value_repeats"]["score"] > 0.9
    assert max(row["reward"] for name, row in found.items() if ">" in name) > 0.5
    with pytest.raises(DatasetError, match="discs: .*value_repeats"):
        run_validate(source, tmp_path, ["discs"])


def test_demo_segmentation_data_is_beyond_every_no_learning_baseline(tmp_path):
    # Raw Dice of the battery's best on the demo generator, against the
    # reference's ~0.8 (environments.autoresearch.demo.demo_tasks); no exact value
    # repeats in a continuous image.
    images, masks = synthetic.textured_objects(5, 48)
    assert masks.mean() > 0.05 and images.dtype == np.float32
    bundle = image_bundle(tmp_path, "objects", images, masks, baseline=0.0, reference=1.0)
    task = grader.load_dir(str(bundle / "private"))
    found = battery.run(bundle / "public", task, grader.grade)
    name, best = battery.best(task, found)
    assert best < 0.55, (name, best)
    assert found["value_repeats"]["score"] < 0.05


def test_demo_builder_puts_the_reward_floor_at_the_best_no_learning_baseline(tmp_path,
                                                                             monkeypatch):
    # The floor is the better of breast-cancer's public baseline (logistic
    # regression on two columns) and its best no-learning baseline (once its
    # best single column, AUC 0.97 against the public baseline's 0.90): every
    # no-learning baseline earns 0, the reference still the top of the scale.
    from environments.autoresearch.demo import demo_tasks
    monkeypatch.setenv("CAMG_CACHE", str(tmp_path / "cache"))
    demo_tasks.build_task("breast-cancer", tmp_path / "bundles")
    bundle = tmp_path / "bundles" / "breast-cancer"
    scoring = json.loads((bundle / "private" / "scoring.json").read_text())
    task = grader.load_dir(str(bundle / "private"))
    found = battery.run(bundle / "public", task, grader.grade)
    name, best = battery.best(task, found)
    assert scoring["baseline_score"] == max(best, scoring["public_baseline_score"])
    assert json.loads((bundle / "task.json").read_text())["baseline_score"] == \
        scoring["baseline_score"]
    if best > scoring["public_baseline_score"]:
        assert scoring["floor_from"] == f"battery:{name}"
    assert max(row["reward"] for row in found.values()) == 0.0
    assert scoring["reference_score"] > scoring["baseline_score"]


def test_a_draw_whose_floor_reaches_the_reference_is_drawn_again_then_refused(tmp_path,
                                                                              monkeypatch):
    from environments.autoresearch.demo import demo_tasks
    monkeypatch.setenv("CAMG_CACHE", str(tmp_path / "cache"))
    calls, draws = [], []

    def perfect(task, results):
        calls.append(1)
        return "oracle_column", 1.0       # a no-learning baseline with AUC 1.0
    monkeypatch.setattr(demo_tasks.battery, "best", perfect)
    draw = demo_tasks._draw_task

    def counted(*args, **kwargs):
        draws.append(1)
        return draw(*args, **kwargs)
    monkeypatch.setattr(demo_tasks, "_draw_task", counted)
    with pytest.raises(demo_tasks.NoRoom):
        demo_tasks.build_task("breast-cancer", tmp_path / "bundles")
    # Every draw is tried and none is kept. A random draw whose reference
    # does not beat the public baseline (rare) is refused before the battery
    # is asked, so the battery sees most draws, not always all.
    assert len(draws) == demo_tasks.DRAWS
    assert 1 <= len(calls) <= demo_tasks.DRAWS
    assert not list((tmp_path / "cache").rglob("task.json"))   # nothing cached
