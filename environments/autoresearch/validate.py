"""``camg.prepare --environment autoresearch --validate``: a task is served only if it is sound.

Two checks per task, both before the manifest is written; a failing task
names itself and what was seen, and preparation refuses:

1. **No answer lookup** (environments.autoresearch.leakscan): none of the task's
   test rows or ids is in the image rootfs, nor in its public workspace
   outside the test inputs themselves (a test row inside train.csv is a
   label given away).
2. **The scale means something** (with ``--helper-socket``): the public
   baseline and the reference solution run in a real episode sandbox over
   [image rootfs, the task's public workspace] as the agent, and their
   submissions graded with the private answers normalise to ≤ 0.05 and
   ≥ 0.9 (the same parse, metric and normalisation as the grader).
3. **It pays only for learning** (environments.autoresearch.battery): no
   no-learning baseline (constants, the majority class, the mean target,
   the inputs themselves, nearest neighbour on ids and row order; for image
   tasks also smoothing and threshold filters and repeated values), made
   from the installed public workspace and scored by the grader's own
   ``grade``, earns more than ``battery.LIMIT`` of the reward scale. Each
   baseline's score and reward goes into the record.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from camg.errors import CamgError, DatasetError
from environments.autoresearch import battery, grader, leakscan, metrics

REFERENCE_MIN, BASELINE_MAX = 0.9, 0.05
WORKSPACE_PREFIX = "/task/"


@dataclasses.dataclass(frozen=True)
class Result:
    task_id: str
    leaks: tuple[str, ...] = ()
    reference: float | None = None
    baseline: float | None = None
    problem: str = ""
    battery: dict = dataclasses.field(default_factory=dict)

    @property
    def paid_without_learning(self) -> list[str]:
        """The baselines over the limit, the best paid first."""
        over = sorted(
            (
                (row["reward"], name, row["score"])
                for name, row in self.battery.items()
                if row["reward"] > battery.LIMIT
            ),
            reverse=True,
        )
        return [
            f"no-learning baseline {name} scores {score:.6g}, reward {reward:.4f} > {battery.LIMIT}"
            for reward, name, score in over
        ]

    @property
    def ok(self) -> bool:
        scored_ok = self.reference is None or (
            self.reference >= REFERENCE_MIN
            and self.baseline is not None
            and self.baseline <= BASELINE_MAX
        )
        return not self.leaks and not self.problem and scored_ok and not self.paid_without_learning

    def to_data(self) -> dict:
        body: dict = {"leaks": list(self.leaks[:5])}
        if self.reference is not None:
            body.update(reference=self.reference, baseline=self.baseline)
        if self.battery:
            body["battery"] = {
                name: {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}
                for name, row in self.battery.items()
            }
        refused = self.paid_without_learning
        if refused:
            body["paid_without_learning"] = refused[:5]
        if self.problem:
            body["problem"] = self.problem[:300]
        return body


def scan(rootfs: Path, publics: Mapping[str, Path]) -> tuple[dict[str, list[str]], dict]:
    """Per task the leaks found; and what was scanned (file counts, seconds)."""
    started = time.monotonic()
    rowsets, inputs = {}, {}
    for task_id, public in publics.items():
        rowsets[task_id], inputs[task_id] = leakscan.task_test_rows(public)
        if not len(rowsets[task_id]):
            raise DatasetError(f"{task_id}: no test rows (test.csv or test*.npy) to check")
    found, image_files = leakscan.scan_tree(rootfs, rowsets, prefix="/")
    leaks = {t: [str(leak) for leak in found[t]] for t in publics}
    workspace_files = 0
    for task_id, public in publics.items():
        own, n = leakscan.scan_tree(
            public, {task_id: rowsets[task_id]}, prefix=WORKSPACE_PREFIX, skip=inputs[task_id]
        )
        workspace_files += n
        leaks[task_id] += [str(leak) for leak in own[task_id]]
    return leaks, {
        "image_files": image_files,
        "workspace_files": workspace_files,
        "seconds": round(time.monotonic() - started, 1),
    }


def _run(helper, rootfs: str, workspace: str, script: bytes, env: dict) -> bytes | None:
    """The script's /workspace/submission.csv from a fresh agent sandbox."""
    sandbox = helper.create_sandbox(
        [rootfs, workspace],
        memory_bytes=2 << 30,
        cpu_quota=1.0,
        pids_max=256,
        hostname="research",
        upper="disk",
        upper_bytes=512 << 20,
    )
    try:
        r = helper.exec(
            sandbox,
            "cat > /workspace/.camg-validate.py && "
            "python /workspace/.camg-validate.py /task /workspace/submission.csv",
            user="agent",
            cwd="/workspace",
            env=env,
            stdin=script,
            timeout=900,
            output_limit=2000,
        )
        if r.exit_code != 0:
            raise DatasetError(f"exit {r.exit_code}: {r.output[-300:]}")
        with tarfile.open(
            fileobj=io.BytesIO(helper.get_archive(sandbox, "/workspace/submission.csv")), mode="r:"
        ) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                return None
            extracted = tar.extractfile(member)
            assert extracted is not None  # a regular file's member has its data
            return extracted.read()
    finally:
        helper.destroy(sandbox)


def scores(helper, image, workspace: Path, bundle: Path) -> tuple[float, float]:
    """(reference, baseline) rewards, normalised by the bundle's scoring."""
    scoring = json.loads((bundle / "private" / "scoring.json").read_text())
    ids, truth = metrics.read_answers((bundle / "private" / "answers.csv").read_bytes())
    env = dict(e.split("=", 1) for e in image.env if "=" in e)
    env["HOME"] = "/workspace"
    rewards = []
    for script in (bundle / "reference" / "solve.py", bundle / "public" / "baseline.py"):
        data = _run(helper, image.rootfs, str(workspace), script.read_bytes(), env)
        predicted = metrics.parse_submission(
            data or b"", ids, integer=scoring["metric"] == "accuracy"
        )
        rewards.append(
            metrics.normalise(
                metrics.score(scoring["metric"], truth, predicted),
                scoring["baseline_score"],
                scoring["reference_score"],
            )
        )
    return rewards[0], rewards[1]


def no_learning(public: Path, private: Path) -> dict[str, dict]:
    """Each no-learning baseline's {score, reward}, graded by the grader's
    own code on the task's private answers."""
    return battery.run(public, grader.load_dir(str(private)), grader.grade)


def validate(
    chosen: Sequence[str],
    source: Path,
    workspaces_root: Path,
    image,
    helper_socket: str | None,
    *,
    battery_check: bool = True,
) -> dict:
    """The manifest's ``validation`` record; DatasetError naming every bad task.
    ``battery_check=False`` (the leak scan's own tests) skips the no-learning
    battery; preparation always runs it."""
    publics = {t: workspaces_root / t / "task" for t in chosen}
    leaks, scanned = scan(Path(image.rootfs), publics)
    results = []
    helper = None
    if helper_socket:
        from camg.helper_client import HelperClient

        helper = HelperClient(helper_socket, owner="autoresearch-validate")
    try:
        for task_id in chosen:
            reference = baseline = None
            problem = ""
            found: dict = {}
            try:
                if battery_check:
                    found = no_learning(publics[task_id], source / task_id / "private")
            except (OSError, ValueError, KeyError) as exc:
                problem = f"no-learning battery: {type(exc).__name__}: {exc}"
            if helper is not None and not problem:
                try:
                    reference, baseline = scores(
                        helper, image, workspaces_root / task_id, source / task_id
                    )
                except (CamgError, OSError, ValueError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
            results.append(
                Result(task_id, tuple(leaks[task_id]), reference, baseline, problem, found)
            )
    finally:
        if helper is not None:
            helper.close()
    bad = [r for r in results if not r.ok]
    if bad:
        raise DatasetError(
            "validation refused "
            + "; ".join(
                f"{r.task_id}: "
                + json.dumps({k: v for k, v in r.to_data().items() if k != "battery"})
                for r in bad
            )
        )
    return {
        "scanned": {**scanned, "image": str(image.rootfs)},
        "scored": helper_socket is not None,
        "tasks": {r.task_id: r.to_data() for r in results},
    }
