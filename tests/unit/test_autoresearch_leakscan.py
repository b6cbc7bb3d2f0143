"""The answer-lookup check of ``prepare --validate`` (environments.autoresearch.leakscan/validate).

The planted task is the first demo set's digits task (scikit-learn's bundled
digits, the seeded 70/30 split): against a rootfs that carries scikit-learn's
data where the old research image did, it is refused, naming the file. A
task of the new demo set passes against the same rootfs; copies of its test
rows in other layouts and formats are found; the workspace's own train.csv
holding a test row is a leak.
"""

from __future__ import annotations

import csv
import json
import pickle
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from camg.errors import DatasetError
from environments.autoresearch import leakscan, validate

SITE = "opt/research-venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def old_image(tmp_path_factory) -> Path:
    """A rootfs with scikit-learn's bundled data at the old image's path."""
    import sklearn
    root = tmp_path_factory.mktemp("rootfs")
    data = Path(sklearn.__file__).parent / "datasets" / "data"
    shutil.copytree(data, root / SITE / "sklearn" / "datasets" / "data")
    (root / "usr" / "share").mkdir(parents=True)
    (root / "usr" / "share" / "notes.txt").write_text("1 2 3 4 5 6 7 8 9 10\n")
    return root


def _old_digits(workspaces: Path) -> None:
    from sklearn import datasets
    d = datasets.load_digits()
    order = np.random.RandomState(20261130).permutation(len(d.target))
    public = workspaces / "digits" / "task"
    public.mkdir(parents=True)
    with open(public / "test.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *[f"pixel_{i}" for i in range(64)]])
        w.writerows([f"di{i:04d}", *(str(int(v)) for v in d.data[i])] for i in order[:539])
    with open(public / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *[f"pixel_{i}" for i in range(64)], "target"])
        w.writerows([f"di{i:04d}", *(str(int(v)) for v in d.data[i]), d.target[i]]
                     for i in order[539:])


def _new_task(workspaces: Path, name: str) -> Path:
    """A new demo task's public files (the generator and split of the builder)."""
    from environments.autoresearch.demo import synthetic
    # digits: 300 images, not 1797 (rendering is the slow part)
    X, y, features = synthetic.GENERATORS[name](0x5EED_0F_7E57, *([300] if name == "digits" else []))
    private, public_idx = synthetic.split(0x5EED_0F_7E57, len(y), 0.3)
    public = workspaces / name / "task"
    public.mkdir(parents=True)
    with open(public / "test.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *features])
        w.writerows([f"t{i:04d}", *(repr(float(v)) for v in X[i])] for i in private)
    with open(public / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *features, "target"])
        w.writerows([f"t{i:04d}", *(repr(float(v)) for v in X[i]), y[i]] for i in public_idx)
    return public


def _image(root: Path):
    return types.SimpleNamespace(rootfs=str(root))


def test_the_old_sklearn_digits_task_is_refused_naming_the_file(old_image, tmp_path):
    _old_digits(tmp_path)
    with pytest.raises(DatasetError) as caught:
        validate.validate(["digits"], tmp_path, tmp_path, _image(old_image), None,
                          battery_check=False)
    message = str(caught.value)
    assert f"/{SITE}/sklearn/datasets/data/digits.csv.gz: 539 test row(s)" in message, message
    assert "notes.txt" not in message


def test_new_demo_tasks_pass_against_the_same_rootfs(old_image, tmp_path):
    for name in ("breast-cancer", "digits", "diabetes"):
        _new_task(tmp_path, name)
    # the leak scan alone: these tasks have no private answers here (the
    # no-learning battery's own tests are test_autoresearch_battery.py)
    record = validate.validate(["breast-cancer", "digits", "diabetes"], tmp_path, tmp_path,
                               _image(old_image), None, battery_check=False)
    assert record["tasks"] == {t: {"leaks": []} for t in ("breast-cancer", "digits", "diabetes")}
    assert record["scanned"]["image_files"] >= 8 and record["scanned"]["workspace_files"] == 3
    assert record["scored"] is False


def test_copies_in_other_layouts_and_formats_are_found(tmp_path):
    public = _new_task(tmp_path / "ws", "diabetes")
    rows, inputs = leakscan.task_test_rows(public)
    assert inputs == {"test.csv"} and len(rows) == 133
    with open(public / "test.csv") as f:
        body = list(csv.reader(f))[1:]
    X = np.array([[float(v) for v in r[1:]] for r in body])
    ids = [r[0] for r in body]
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    np.save(root / "a" / "rows32.npy", X.astype(np.float32))               # float32 array
    (root / "a" / "rows.json").write_text(json.dumps(X.tolist()))           # nested JSON
    (root / "a" / "rows.pkl").write_bytes(pickle.dumps(X))                  # pickled array
    (root / "a" / "label_first.txt").write_text(                            # label first, 3 dp
        "\n".join(" ".join(["7"] + [f"{v:.4g}" for v in x]) for x in X[:5]))
    (root / "a" / "answers.csv").write_text("id,target\n" + "".join(f"{i},1\n" for i in ids))
    np.save(root / "a" / "other.npy", np.random.default_rng(0).normal(size=(50, 10)))
    found, scanned = leakscan.scan_tree(root, {"diabetes": rows})
    names = {leak.path: (leak.rows, leak.ids) for leak in found["diabetes"]}
    assert names == {"/a/rows32.npy": (133, 0), "/a/rows.json": (133, 0),
                     "/a/rows.pkl": (133, 0), "/a/label_first.txt": (5, 0),
                     "/a/answers.csv": (0, 133)}, names
    assert scanned == 6


def test_a_test_row_inside_the_public_training_data_is_a_leak(tmp_path):
    public = _new_task(tmp_path, "breast-cancer")
    test_rows = (public / "test.csv").read_text().splitlines()[1:4]
    with open(public / "train.csv", "a") as f:
        f.writelines(line + ",1\n" for line in test_rows)
    with pytest.raises(DatasetError, match=r"/task/train\.csv: 3 test row\(s\), 3 test id"):
        validate.validate(["breast-cancer"], tmp_path, tmp_path, _image(tmp_path / "none"), None)


def test_canonical_form_ignores_printed_precision():
    a = leakscan.canonical(np.array([0.12341, 12.0, -3.5e-7, 0.0, np.nan]))
    b = leakscan.canonical(np.array([0.1234, 12, -3.50000001e-7, -0.0, np.inf]))
    assert a.tolist() == b.tolist()
    assert leakscan.canonical(np.array([1.0]))[0] != leakscan.canonical(np.array([-1.0]))[0]
