"""Scoring: submissions parsed strictly, metrics in plain numpy, rewards normalised.

Shared by the private grader (which alone sees the answers) and the demo
task builder (which computes the baseline and reference scores the reward
is normalised between). A submission is a CSV ``id,prediction`` holding
exactly the task's private ids, once each, in any order; anything else is
``SubmissionInvalid`` and earns 0.
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np

METRICS = ("roc_auc", "accuracy", "mae", "dice")
HIGHER_IS_BETTER = {"roc_auc": True, "accuracy": True, "mae": False, "dice": True}
MAX_SUBMISSION_BYTES = 8 << 20


class SubmissionInvalid(ValueError):
    """The submission cannot be scored (missing, malformed, wrong ids).

    ``rule`` names why, for the outcome record: ``unknown_id`` (an id the
    test set does not have: a probe, not a mistake, so the episode reports
    it as tampering), ``duplicate_id``, ``partial``, ``not_finite``,
    ``not_number``, ``fields``, ``header``, ``encoding``, ``size``."""

    def __init__(self, message: str, rule: str = "malformed") -> None:
        super().__init__(message)
        self.rule = rule


def parse_submission(data: bytes, ids: list[str], *, integer: bool = False) -> np.ndarray:
    """Predictions in the order of ``ids``."""
    if len(data) > MAX_SUBMISSION_BYTES:
        raise SubmissionInvalid(f"submission is larger than {MAX_SUBMISSION_BYTES} bytes", "size")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionInvalid("submission is not UTF-8 text", "encoding") from None
    # newline="": the csv module's own line splitting (a lone CR ends a line).
    # Rows are read one at a time: listing them all first held ~0.5 GB in the
    # grader for 8 MiB of ",\n".
    rows = _rows(csv.reader(io.StringIO(text, newline="")))
    header = next(rows, None)
    if header is None or [c.strip().lower() for c in header] != ["id", "prediction"]:
        raise SubmissionInvalid("the first line must be the header 'id,prediction'", "header")
    wanted = {i: n for n, i in enumerate(ids)}
    values = np.full(len(ids), np.nan)
    seen = set()
    for lineno, row in enumerate(rows, 2):
        if not row:
            continue
        if len(row) != 2:
            raise SubmissionInvalid(f"line {lineno}: expected 2 fields, got {len(row)}", "fields")
        key = row[0].strip()
        if key not in wanted:
            raise SubmissionInvalid(f"line {lineno}: unknown id {key[:40]!r}", "unknown_id")
        if key in seen:
            raise SubmissionInvalid(f"line {lineno}: id {key[:40]!r} appears twice", "duplicate_id")
        try:
            value = float(row[1])
        except ValueError:
            raise SubmissionInvalid(
                f"line {lineno}: prediction is not a number", "not_number"
            ) from None
        if not math.isfinite(value) or (integer and value != int(value)):
            raise SubmissionInvalid(
                f"line {lineno}: prediction must be a finite {'integer' if integer else 'number'}",
                "not_finite",
            )
        seen.add(key)
        values[wanted[key]] = value
    if len(seen) != len(ids):
        raise SubmissionInvalid(f"submission has {len(seen)} of the {len(ids)} ids", "partial")
    return values


def _rows(reader):
    """The reader's rows; whatever the csv module refuses (a field past its
    size limit) is a malformed submission. Its csv.Error once escaped as a
    grading failure, reward null, which an agent could choose in order to
    have an episode masked instead of scored 0."""
    try:
        yield from reader
    except csv.Error as exc:
        raise SubmissionInvalid(f"not CSV: {str(exc)[:80]}", "csv") from None


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2.0
            start = end
    return ranks


def roc_auc(truth: np.ndarray, scores: np.ndarray) -> float:
    positive = truth == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes in the answers")
    ranks = _ranks(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def accuracy(truth: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(truth == predicted))


def mae(truth: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(truth - predicted)))


def dice(truth: np.ndarray, predicted: np.ndarray) -> float:
    """Dice of two binary masks flattened to one vector (1.0 when both are empty)."""
    t, p = truth > 0.5, predicted > 0.5
    denominator = t.sum() + p.sum()
    return 1.0 if denominator == 0 else float(2.0 * np.logical_and(t, p).sum() / denominator)


def score(metric: str, truth: np.ndarray, predicted: np.ndarray) -> float:
    if metric == "roc_auc":
        return roc_auc(truth, predicted)
    if metric == "accuracy":
        return accuracy(truth, predicted)
    if metric == "mae":
        return mae(truth, predicted)
    if metric == "dice":
        return dice(truth, predicted)
    raise ValueError(f"unknown metric {metric!r}")


#: A score within this fraction of the baseline-to-reference span of either
#: end is that end: the reference's score is measured once when the demo is
#: built (on the host's numpy), the oracle's in the sandbox (the image's), and
#: the same predictions summed in another order differ in the last bits (a
#: cold CI run gave diabetes's oracle 0.9999999999999996). 1e-9 of the span
#: is far below any real improvement.
_ENDS = 1e-9


def normalise(value: float, baseline: float, reference: float) -> float:
    """0 at the baseline's score, 1 at the reference's, clipped to [0, 1];
    works for lower-is-better metrics too (reference < baseline)."""
    if reference == baseline:
        raise ValueError("baseline and reference scores are equal: the task cannot normalise")
    fraction = (value - baseline) / (reference - baseline)
    if abs(fraction - 1.0) <= _ENDS:
        return 1.0
    if abs(fraction) <= _ENDS:
        return 0.0
    return float(min(1.0, max(0.0, fraction)))


def read_answers(data: bytes) -> tuple[list[str], np.ndarray]:
    """The private answers file: CSV ``id,target``."""
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    if not rows or [c.strip() for c in rows[0]] != ["id", "target"]:
        raise ValueError("answers must start with the header 'id,target'")
    ids = [r[0] for r in rows[1:] if r]
    return ids, np.array([float(r[1]) for r in rows[1:] if r])
