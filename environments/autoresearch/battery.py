"""No-learning baselines: a task pays only for what they cannot do.

RL learns exactly what the reward pays for. A task on which a constant, a
copy of the inputs or a stock filter already earns reward pays for no
research: the first segmentation task gave a Gaussian blur and a threshold
0.985 of its scale, and "pixels whose exact value repeats" (MONAI's
generator paints each disc one constant intensity) 0.99.

``run`` makes each baseline's submission from the task's public files alone
and scores it with the private grader's own ``grader.grade`` (the parse,
metric and normalisation that score agents). ``prepare --validate`` refuses
a task on which any of them earns more than ``LIMIT`` of the reward scale;
the demo builder (environments.autoresearch.demo.demo_tasks) puts the reward's floor at
the best of them, so the scale starts where learning starts.

Baselines by the task's public files:

* tabular (train.csv with the target last, test.csv): a constant per class
  (or 0), the majority class, the mean and the median target, each input
  column as the prediction (negated too for ROC AUC; the best column is
  reported), nearest neighbour on ids (the target of the training row whose
  id sorts next to the test row's) and on row order (training row i's
  target for test row i);
* images (train_images.npy, train_masks.npy, test_images.npy; one answer per
  pixel, image by image, row-major, as answers.csv lists them): all
  background, all foreground, the mean training mask, the raw input itself,
  the raw input, its Gaussian (sigma 1, 2) and median (3, 5) smoothings and
  its local standard deviation (texture; Gaussian windows of sigma 1, 2, 4),
  each cut at 0.5, at Otsu's threshold, at the training foreground's
  percentile and at the one global threshold that fits the training masks
  best, above and below; pixels whose exact value repeats at least three
  times in their image, and row order (training mask n for test image n).

What stays open: a hand-made filter outside this list (an edge detector,
morphology, a band of two thresholds) is research the battery does not
attempt; the demo's
segmentation generator is built so that no single such feature separates
its foreground (environments.autoresearch.demo.synthetic.textured_objects).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: the most of the reward scale a no-learning baseline may earn
LIMIT = 0.1
_FILTERS = (
    ("raw", "raw", 0),
    ("gaussian_1", "gaussian", 1.0),
    ("gaussian_2", "gaussian", 2.0),
    ("median_3", "median", 3),
    ("median_5", "median", 5),
    ("local_std_1", "local_std", 1.0),
    ("local_std_2", "local_std", 2.0),
    ("local_std_4", "local_std", 4.0),
)


def _filtered(stack: np.ndarray, kind: str, size: float) -> np.ndarray:
    from scipy import ndimage

    if kind == "raw":
        return stack
    if kind == "gaussian":
        return np.array([ndimage.gaussian_filter(x, size) for x in stack])
    if kind == "median":
        return np.array([ndimage.median_filter(x, int(size)) for x in stack])
    # texture: the standard deviation in a Gaussian window
    means = np.array([ndimage.gaussian_filter(x, size) for x in stack])
    squares = np.array([ndimage.gaussian_filter(x * x, size) for x in stack])
    return np.sqrt(np.maximum(squares - means**2, 0.0))


def _csv_table(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    return (
        rows[0],
        [r[0] for r in rows[1:]],
        np.array([[float(v) for v in r[1:]] for r in rows[1:]]),
    )


def _submission(ids: list[str], values: np.ndarray, integer: bool) -> bytes:
    out = io.StringIO()
    out.write("id,prediction\n")
    for i, v in zip(ids, np.asarray(values, dtype=float).ravel(), strict=True):
        out.write(f"{i},{int(round(v)) if integer else repr(float(v))}\n")
    return out.getvalue().encode()


def _id_key(value: str) -> tuple:
    """Natural order: digits compared as numbers (tb0012 < tb0100)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", value))


def tabular(public: Path, metric: str) -> tuple[list[str], Iterator[tuple[str, np.ndarray]]]:
    """The test ids (test.csv's order) and the baselines' predictions in it."""
    head, train_ids, train = _csv_table(public / "train.csv")
    _, test_ids, test = _csv_table(public / "test.csv")
    return test_ids, _tabular(head, train_ids, train, test_ids, test, metric)


def _tabular(head, train_ids, train, test_ids, test, metric):
    y = train[:, -1]
    classes = np.unique(y)
    if metric == "accuracy" or len(classes) <= 20:
        for c in classes:
            yield f"constant_{c:g}", np.full(len(test_ids), c)
        values, counts = np.unique(y, return_counts=True)
        yield "majority", np.full(len(test_ids), values[np.argmax(counts)])
    else:
        yield "constant_0", np.zeros(len(test_ids))
    yield "mean", np.full(len(test_ids), y.mean())
    yield "median", np.full(len(test_ids), np.median(y))
    for n, name in enumerate(head[1 : 1 + test.shape[1]]):
        yield f"identity:{name}", test[:, n]
        if metric == "roc_auc":
            yield f"identity:-{name}", -test[:, n]
    keys = sorted(
        [(_id_key(i), 0, n) for n, i in enumerate(train_ids)]
        + [(_id_key(i), 1, n) for n, i in enumerate(test_ids)]
    )
    nearest = np.zeros(len(test_ids))
    train_at = [n for _, kind, n in keys if kind == 0]
    position = 0
    for _key, kind, n in keys:
        if kind == 0:
            position += 1
        else:  # the training row sorted just before it (or the first one)
            nearest[n] = y[train_at[max(position - 1, 0)]]
    yield "nearest_id", nearest
    yield "row_order", y[np.arange(len(test_ids)) % len(y)]


def _otsu(x: np.ndarray) -> float:
    hist, edges = np.histogram(x, bins=256)
    centres = (edges[:-1] + edges[1:]) / 2
    w = np.cumsum(hist)
    mu = np.cumsum(hist * centres)
    total, mean = w[-1], mu[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (mean * w - total * mu) ** 2 / (w * (total - w))
    return float(centres[np.nanargmax(between[:-1])])


def _dice(truth: np.ndarray, predicted: np.ndarray) -> float:
    denominator = truth.sum() + predicted.sum()
    return 1.0 if denominator == 0 else 2.0 * np.logical_and(truth, predicted).sum() / denominator


def images(public: Path) -> Iterator[tuple[str, np.ndarray]]:
    train = np.load(public / "train_images.npy", allow_pickle=False).astype(float)
    masks = np.load(public / "train_masks.npy", allow_pickle=False) > 0.5
    test = np.load(public / "test_images.npy", allow_pickle=False).astype(float)
    yield "constant_0", np.zeros(test.shape)
    yield "constant_1", np.ones(test.shape)
    yield "mean_mask", np.broadcast_to(masks.mean(axis=0) > 0.5, test.shape)
    yield "identity", test
    fraction = float(masks.mean())
    for name, kind, size in _FILTERS:
        fitted_on, smoothed = _filtered(train, kind, size), _filtered(test, kind, size)
        candidates = np.quantile(fitted_on, np.linspace(0.01, 0.99, 99))
        cuts: dict[str, Callable[[np.ndarray], float]] = {
            "0.5": lambda x: 0.5,
            "otsu": _otsu,
            "percentile": lambda x: float(np.quantile(x, 1.0 - fraction)),
        }
        for sign, side in ((1, "above"), (-1, "below")):
            for cut_name, cut in cuts.items():
                yield (
                    f"{name}>{cut_name}:{side}",
                    np.array([sign * (x - cut(x)) > 0 for x in smoothed]),
                )
            best = max(candidates, key=lambda t: _dice(masks, sign * (fitted_on - t) > 0))
            yield f"{name}>fitted:{side}", sign * (smoothed - best) > 0
    repeats = []
    for x in test:
        values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
        repeats.append((counts[inverse] >= 3).reshape(x.shape))
    yield "value_repeats", np.array(repeats)
    yield "row_order", masks[np.arange(len(test)) % len(masks)]


def run(public: Path, task: dict, grade: Callable[[dict, bytes], dict]) -> dict[str, dict]:
    """Each baseline's {score, reward} through ``grade`` (grader.grade) with
    ``task`` (grader.load_dir's): ``identity:<column>`` rows folded into the
    best column's."""
    integer, ids = bool(task["integer"]), task["ids"]
    order = None
    if (public / "test.csv").is_file():
        test_ids, made = tabular(public, task["metric"])
        at = {i: n for n, i in enumerate(test_ids)}
        missing = [i for i in ids if i not in at]
        if missing:
            raise ValueError(f"answer id {missing[0]!r} is not in test.csv")
        order = np.array([at[i] for i in ids])
    elif (public / "test_images.npy").is_file():
        made = images(public)
    else:
        raise ValueError(f"{public}: neither test.csv nor test_images.npy")
    results: dict[str, dict] = {}
    for name, values in made:
        values = np.asarray(values, dtype=float).ravel()
        if order is not None:
            values = values[order]
        if len(values) != len(ids):
            raise ValueError(f"baseline {name}: {len(values)} predictions for {len(ids)} answers")
        reply = grade(task, _submission(ids, values, integer))
        if not reply.get("valid"):
            raise ValueError(
                f"baseline {name}: the grader refused its submission: {reply.get('detail')}"
            )
        row: dict[str, Any] = {"score": float(reply["score"]), "reward": float(reply["reward"])}
        if name.startswith("identity:"):
            kept = results.get("identity_column")
            if (
                kept is not None
                and kept["reward"] >= row["reward"]
                and (kept["reward"] > 0 or _better(task, kept["score"], row["score"]))
            ):
                continue
            name, row = "identity_column", {**row, "column": name.split(":", 1)[1]}
        results[name] = row
    return results


def _better(task: dict, a: float, b: float) -> bool:
    """Score ``a`` at least as good as ``b`` by the task's metric."""
    higher = task["reference"] > task["baseline"]
    return a >= b if higher else a <= b


def best(task: dict, results: dict[str, dict]) -> tuple[str, float]:
    """The baseline with the best raw score (the floor of a rescaled reward)."""
    name = max(
        results,
        key=lambda n: results[n]["score"] * (1 if task["reference"] > task["baseline"] else -1),
    )
    return name, results[name]["score"]
