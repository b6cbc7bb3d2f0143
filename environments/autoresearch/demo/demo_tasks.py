"""The AutoResearch demo task set: simulated data drawn fresh per build
(environments.autoresearch.demo.synthetic).

Four tasks, each with a public/private split, a baseline (public,
/task/baseline.py) and a reference solution (kept in the task package,
never shown to the agent):

* ``breast-cancer`` — simulated fine-needle aspirates (569 patients, the 30
  nucleus features of the Wisconsin data's layout); ROC AUC of
  P(malignant). Baseline: logistic regression on two raw features;
  reference: standardised logistic regression on all 30.
* ``digits`` — simulated handwritten digits, 8x8 block counts 0-16 as in
  UCI's optical digits (1797 images); accuracy. Baseline: nearest centroid;
  reference: RBF SVM.
* ``diabetes`` — simulated diabetes progression (442 patients, ten baseline
  variables); mean absolute error (lower is better). Baseline: the training
  mean; reference: ridge regression.
* ``segmentation`` — simulated textured objects (synthetic.textured_objects:
  64x64, targets among bright and textured distractors; 32 public with
  masks, 16 private), each image from its own random stream; Dice of the
  predicted foreground. Baseline: threshold the raw intensity at 0.5;
  reference: a per-pixel gradient-boosting classifier on brightness and
  texture features, trained on the labelled images. MONAI (with CPU torch)
  is in the image for agents who train a network.

Every build draws 128 bits of entropy (``secrets``) per task and keeps them
in the bundle's ``private/generator.json`` (installed under the private
root beside the answers): no fixed seed, no public data set, so nothing in
the image or the public workspace can reproduce a test row's answer (the
first demo set's tasks came from scikit-learn's bundled data and were
answered by lookup; issue 29). ``camg.prepare --validate`` checks it.

The baseline and reference scores are computed here by running the very
scripts the bundle ships, with the scikit-learn/numpy releases the image
pins (requirements.lock's), so the reference earns 1.0 in the sandbox. The
reward's floor (scoring.json ``baseline_score``) is the better of the public
baseline's score and the best no-learning baseline's
(environments.autoresearch.battery, scored by the grader's code): whatever needs
no learning earns 0. A draw on which that floor reaches the reference is
drawn again.
"""

from __future__ import annotations

import csv
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from environments.autoresearch import battery, grader, metrics
from environments.autoresearch.demo import synthetic

PRIVATE_FRACTION = 0.3

_READ = """
import csv, sys
import numpy as np

TASK = sys.argv[1] if len(sys.argv) > 1 else "/task"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/workspace/submission.csv"


def read(name):
    with open(f"{TASK}/{name}") as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    ids = [r[0] for r in body]
    values = np.array([[float(v) for v in r[1:]] for r in body])
    return head, ids, values


head, _, train = read("train.csv")
X, y = train[:, :-1], train[:, -1]
_, test_ids, X_test = read("test.csv")


def write(predictions):
    with open(OUT, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "prediction"])
        for i, p in zip(test_ids, predictions):
            w.writerow([i, repr(float(p))])
"""

SCRIPTS = {
    "breast-cancer": {
        "baseline": _READ
        + """
from sklearn.linear_model import LogisticRegression
model = LogisticRegression(max_iter=1000).fit(X[:, :2], y)
write(model.predict_proba(X_test[:, :2])[:, 1])
""",
        "reference": _READ
        + """
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
model = make_pipeline(StandardScaler(), LogisticRegression(C=0.3, max_iter=5000)).fit(X, y)
write(model.predict_proba(X_test)[:, 1])
""",
    },
    "digits": {
        "baseline": _READ
        + """
from sklearn.neighbors import NearestCentroid
write(NearestCentroid().fit(X, y).predict(X_test).astype(int))
""",
        "reference": _READ
        + """
from sklearn.svm import SVC
write(SVC(gamma=0.001, C=10.0).fit(X, y).predict(X_test).astype(int))
""",
    },
    "diabetes": {
        "baseline": _READ
        + """
write(np.full(len(X_test), y.mean()))
""",
        "reference": _READ
        + """
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
write(make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(X, y).predict(X_test))
""",
    },
}

_SEG_IO = """
import sys
import numpy as np

TASK = sys.argv[1] if len(sys.argv) > 1 else "/task"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/workspace/submission.csv"
X = np.load(f"{TASK}/test_images.npy")


def write(masks):
    with open(OUT, "w") as f:
        f.write("id,prediction\\n")
        for n, mask in enumerate(masks):
            for p, v in enumerate(np.asarray(mask).ravel()):
                f.write(f"sg{n:02d}_{p:04d},{int(bool(v))}\\n")
"""

SCRIPTS["segmentation"] = {
    "baseline": _SEG_IO
    + """
write(X > 0.5)
""",
    # A learned per-pixel classifier: brightness and texture at three scales,
    # relative to each image's own level, fitted on a sample of the labelled
    # pixels by gradient boosting; its probabilities smoothed, cut at 0.5.
    "reference": _SEG_IO
    + """
from scipy import ndimage
from sklearn.ensemble import HistGradientBoostingClassifier


def features(x):
    centre = np.median(x)
    x = (x - centre) / (1.4826 * np.median(np.abs(x - centre)) + 1e-6)
    out = [x, ndimage.gaussian_gradient_magnitude(x, 1.5)]
    for sigma in (1.0, 2.0, 4.0):
        mean = ndimage.gaussian_filter(x, sigma)
        out += [mean, np.sqrt(np.maximum(ndimage.gaussian_filter(x * x, sigma) - mean ** 2, 0))]
    return np.stack([f.ravel() for f in out], axis=1)


images = np.load(f"{TASK}/train_images.npy")
labels = np.load(f"{TASK}/train_masks.npy").reshape(-1)
F = np.concatenate([features(x) for x in images])
pick = np.random.RandomState(0).choice(len(labels), min(40000, len(labels)), replace=False)
model = HistGradientBoostingClassifier(max_iter=80, random_state=0).fit(F[pick], labels[pick])
probabilities = [model.predict_proba(features(x))[:, 1].reshape(x.shape) for x in X]
write(np.array([ndimage.gaussian_filter(p, 1.0) > 0.5 for p in probabilities]))
""",
}

SEG_PUBLIC, SEG_PRIVATE = 32, 16


STATEMENTS = {
    "breast-cancer": (
        "Breast cancer diagnosis (simulated aspirates)",
        "roc_auc",
        "Predict, for each row of /task/test.csv, the probability that the tumour "
        "is malignant (target 1 in /task/train.csv). Each row summarises the "
        "nuclei of one simulated fine-needle aspirate: the mean, standard error "
        "and worst value of ten measures (radius, texture, perimeter, area, "
        "smoothness, compactness, concavity, concave points, symmetry, fractal "
        "dimension), laid out like the Wisconsin diagnostic data. Scored by ROC "
        "AUC on hidden labels.",
    ),
    "digits": (
        "Handwritten digits (simulated)",
        "accuracy",
        "Classify each 8x8 image (64 pixel intensities 0-16: on-pixels of a 32x32 "
        "bitmap counted in 4x4 blocks, as in UCI's optical digits) of /task/test.csv "
        "as a digit 0-9. The digits are simulated pen strokes of varying slant, size, "
        "width and position with scanner specks; /task/train.csv has labelled images "
        "(last column). Scored by accuracy on hidden labels; predictions must be "
        "integers.",
    ),
    "diabetes": (
        "Diabetes progression (simulated patients)",
        "mae",
        "Predict the disease progression one year after baseline for each simulated "
        "patient of /task/test.csv from ten baseline variables (age, sex, BMI, blood "
        "pressure, six serum measurements; /task/train.csv has the target as its last "
        "column). Scored by mean absolute error on hidden targets (lower is better).",
    ),
    "segmentation": (
        "Textured object segmentation (simulated)",
        "dice",
        "Segment the target objects in 16 noisy 64x64 images "
        "(/task/test_images.npy, float32 [16, 64, 64]); /task/train_images.npy and "
        "/task/train_masks.npy hold 32 labelled examples (mask 1 on targets). Each "
        "image holds a few ellipses over an uneven background, under noise and its "
        "own brightness and contrast; not every object is a target. Submit one "
        "line per pixel: id sgNN_PPPP (image NN, row-major pixel PPPP), prediction "
        "1 for foreground, 0 for background. Scored by Dice over all pixels. "
        "MONAI and CPU torch are installed.",
    ),
}


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _write_csv(path: Path, head: list[str], rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        writer.writerows(rows)


def _run_script(script: Path, task_dir: Path, out: Path, python: str) -> bytes:
    subprocess.run(
        [python, str(script), str(task_dir), str(out)], check=True, capture_output=True, timeout=600
    )
    return out.read_bytes()


def _write_tabular(name: str, public: Path, private: Path, entropy: int) -> None:
    X, y, features = synthetic.GENERATORS[name](entropy)
    private_idx, public_idx = synthetic.split(entropy, len(y), PRIVATE_FRACTION)
    ids = [f"{name[:2]}{i:04d}" for i in range(len(y))]
    _write_csv(
        public / "train.csv",
        ["id", *features, "target"],
        ([ids[i], *map(_fmt, X[i]), _fmt(y[i])] for i in public_idx),
    )
    _write_csv(
        public / "test.csv", ["id", *features], ([ids[i], *map(_fmt, X[i])] for i in private_idx)
    )
    _write_csv(
        private / "answers.csv", ["id", "target"], ([ids[i], _fmt(y[i])] for i in private_idx)
    )


def _write_segmentation(public: Path, private: Path, entropy: int) -> None:
    images, masks = synthetic.textured_objects(entropy, SEG_PUBLIC + SEG_PRIVATE)
    np.save(public / "train_images.npy", images[:SEG_PUBLIC])
    np.save(public / "train_masks.npy", masks[:SEG_PUBLIC])
    np.save(public / "test_images.npy", images[SEG_PUBLIC:])
    _write_csv(
        private / "answers.csv",
        ["id", "target"],
        (
            [f"sg{n:02d}_{p:04d}", str(int(v))]
            for n, mask in enumerate(masks[SEG_PUBLIC:])
            for p, v in enumerate(mask.ravel())
        ),
    )


def _cache_key(name: str, python: str) -> str:
    """What decides a bundle's scripts and scores' meaning: this builder, the
    generators, the metrics and the releases the scripts run on (read from
    package metadata: no import). The data itself is a fresh draw; a cached
    bundle keeps its draw (the cache is the builder's, never a lower)."""
    import hashlib

    versions = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print([m.version(p) for p in "
            "('numpy', 'scipy', 'scikit-learn')])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    h = hashlib.sha256()
    for path in (__file__, synthetic.__file__, metrics.__file__, battery.__file__, grader.__file__):
        h.update(Path(path).read_bytes())
    h.update(f"{name}\0{python}\0{versions}".encode())
    return h.hexdigest()[:16]


def build_task(name: str, dest: Path, python: str = sys.executable) -> dict:
    """One bundle in ``dest``/name; its scores. Cached under $CAMG_CACHE (a
    bundle is a pure function of _cache_key's inputs): the tests that build
    the set per module copy it instead of re-running every script."""
    import os

    cache = (
        Path(os.environ.get("CAMG_CACHE") or "/var/cache/camg-test")
        / "autoresearch"
        / "bundles"
        / f"{name}-{_cache_key(name, python)}"
    )
    if not (cache / "task.json").is_file():
        _build_task(name, dest, python)
        tmp = cache.parent / f".{cache.name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(dest / name, tmp)
        try:
            tmp.rename(cache)
        except OSError:  # another build got there first: same bytes
            shutil.rmtree(tmp, ignore_errors=True)
        return _scores(dest / name)
    shutil.rmtree(dest / name, ignore_errors=True)
    shutil.copytree(cache, dest / name)
    return _scores(dest / name)


def _scores(bundle: Path) -> dict:
    meta = json.loads((bundle / "task.json").read_text())
    return {"baseline": meta["baseline_score"], "reference": meta["reference_score"]}


class NoRoom(RuntimeError):
    """This draw leaves the reference nothing to earn over what needs no learning."""


#: draws tried before a task is given up (a draw without room is rare)
DRAWS = 3


def _build_task(name: str, dest: Path, python: str = sys.executable) -> dict:
    for attempt in range(DRAWS):
        try:
            return _draw_task(name, dest, python)
        except NoRoom:
            if attempt == DRAWS - 1:
                raise
    raise AssertionError("unreachable")


def _draw_task(name: str, dest: Path, python: str = sys.executable) -> dict:
    bundle = dest / name
    shutil.rmtree(bundle, ignore_errors=True)
    public, private, reference = bundle / "public", bundle / "private", bundle / "reference"
    for d in (public, private, reference):
        d.mkdir(parents=True)
    entropy = secrets.randbits(128)
    if name == "segmentation":
        _write_segmentation(public, private, entropy)
    else:
        _write_tabular(name, public, private, entropy)
    (private / "generator.json").write_text(
        json.dumps(
            {"entropy": f"{entropy:#034x}", "generator": "environments.autoresearch.demo.synthetic"}
        )
        + "\n"
    )
    (public / "baseline.py").write_text(SCRIPTS[name]["baseline"].lstrip())
    (reference / "solve.py").write_text(SCRIPTS[name]["reference"].lstrip())
    title, metric, statement = STATEMENTS[name]
    (public / "README.md").write_text(
        f"# {title}\n\n{statement}\n\nSubmit /workspace/submission.csv with the header "
        "`id,prediction`.\n`python /task/baseline.py` writes "
        "the baseline's submission.\n"
    )
    answer_ids, truth = metrics.read_answers((private / "answers.csv").read_bytes())
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, script in (
            ("baseline", public / "baseline.py"),
            ("reference", reference / "solve.py"),
        ):
            data = _run_script(script, public, Path(tmp) / f"{kind}.csv", python)
            predicted = metrics.parse_submission(data, answer_ids, integer=metric == "accuracy")
            scores[kind] = metrics.score(metric, truth, predicted)
    if not (scores["reference"] > scores["baseline"]) == metrics.HIGHER_IS_BETTER[metric]:
        raise NoRoom(
            f"{name}: reference {scores['reference']} does not beat baseline {scores['baseline']}"
        )
    scoring = {
        "metric": metric,
        "baseline_score": scores["baseline"],
        "reference_score": scores["reference"],
        "public_baseline_score": scores["baseline"],
    }
    (private / "scoring.json").write_text(json.dumps(scoring, indent=1) + "\n")
    # The reward's floor: the better of the public baseline and the best
    # no-learning baseline, each scored by the grader's own code, so that
    # nothing that skips learning earns reward (environments.autoresearch.battery).
    task = grader.load_dir(str(private))
    found = battery.run(public, task, grader.grade)
    floor_name, floor = battery.best(task, found)
    if (
        floor == scores["reference"]
        or (floor > scores["reference"]) == metrics.HIGHER_IS_BETTER[metric]
    ):
        raise NoRoom(
            f"{name}: no-learning baseline {floor_name} scores {floor}, the reference "
            f"{scores['reference']}"
        )
    if (floor > scores["baseline"]) == metrics.HIGHER_IS_BETTER[metric]:
        scores["baseline"] = floor
        scoring.update(baseline_score=floor, floor_from=f"battery:{floor_name}")
    (private / "scoring.json").write_text(json.dumps(scoring, indent=1) + "\n")
    (bundle / "task.json").write_text(
        json.dumps(
            {
                "task_id": name,
                "title": title,
                "metric": metric,
                "statement": statement,
                "baseline_score": scores["baseline"],
                "reference_score": scores["reference"],
            },
            indent=1,
        )
        + "\n"
    )
    return scores


def build(dest: Path, python: str = sys.executable) -> dict:
    dest.mkdir(parents=True, exist_ok=True)
    return {name: build_task(name, dest, python) for name in SCRIPTS}


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1])), indent=1))
