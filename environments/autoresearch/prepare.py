"""``python -m camg.prepare --environment autoresearch``: task bundles -> the three
roots + manifest.

    python -m camg.prepare --environment autoresearch --source DIR \\
        --packages-root /var/lib/camg/autoresearch/tasks \\
        --workspaces-root /var/lib/camg/autoresearch/workspaces \\
        --private-root /var/lib/camg-grader/answers \\
        --images materialized-images.json --output manifest.json [--select ids.txt] \\
        [--validate [--helper-socket SOCK]]

A bundle is one directory per task: ``task.json`` (task_id, title, metric,
statement, baseline_score, reference_score), ``public/`` (what the agent
sees at /task), ``private/`` (answers.csv, scoring.json) and ``reference/``
(the reference solution). Preparation, as root, splits each bundle over the
three separate roots: the task package (task.json, reference/) for
operators, the public workspace (read-only lower of every episode) and the
private answers, owned by the grader's uid with mode 0700 — the service's
own uid cannot read them. The manifest records the workspace tree hashes,
the answers' hashes (the grader re-checks them at start) and the image.

``--validate`` (environments.autoresearch.validate) refuses a task whose test
rows or ids appear in the image or in its workspace outside its test
inputs, one on which a no-learning baseline (environments.autoresearch.battery:
constants, copied inputs, neighbours by id or row, stock filters and
thresholds) earns more than 0.1 of the reward scale, and, with
``--helper-socket``, one whose baseline does not earn ≤ 0.05 or whose
reference does not earn ≥ 0.9 in a real sandbox.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.config.hashing import sha256_tree
from camg.config.host_private import private_dir
from camg.errors import CamgError, DatasetError
from camg.oci.images import by_name, load_materialized

CREATED_BY = "camg.prepare 0.1.0 (autoresearch)"
TASK_FIELDS = {"task_id", "title", "metric", "statement", "baseline_score", "reference_score"}


def answers_hash(private_dir: Path) -> str:
    """What the grader reports at hello for one task (grader._load)."""
    data = (
        (private_dir / "answers.csv").read_bytes()
        + b"\0"
        + (private_dir / "scoring.json").read_bytes()
    )
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _copy_public(src: Path, dest: Path) -> None:
    """root-owned, world-readable, nobody may write: the agent reads it."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=False)
    for dirpath, _dirnames, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    if os.geteuid() == 0:
        for dirpath, _dirnames, filenames in os.walk(dest):
            os.chown(dirpath, 0, 0)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), 0, 0)


def _install_private(src: Path, root: Path, task_id: str, uid: int, gid: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    os.chown(root, uid, gid)
    dest = root / task_id
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(mode=0o700)
    # generator.json: the demo builder's entropy (environments.autoresearch.demo.demo_tasks)
    for name in ("answers.csv", "scoring.json", "generator.json"):
        if name == "generator.json" and not (src / name).is_file():
            continue
        shutil.copyfile(src / name, dest / name)
        os.chmod(dest / name, 0o600)
        os.chown(dest / name, uid, gid)
    os.chown(dest, uid, gid)


def prepare(
    *,
    source: str | Path,
    packages_root: str | Path,
    workspaces_root: str | Path,
    private_root: str | Path,
    images: str | Path,
    image_name: str,
    output: str | Path,
    grader_user: str = "camg-grader",
    select: Sequence[str] | None = None,
    validate: bool = False,
    helper_socket: str | None = None,
) -> dict:
    source = Path(source)
    try:
        account = pwd.getpwnam(grader_user)
    except KeyError:
        raise DatasetError(f"grader user {grader_user!r} does not exist") from None
    if os.geteuid() != 0:
        raise DatasetError(
            "preparation installs the private answers as the grader's uid: run it as root"
        )
    catalog = by_name(load_materialized(images))
    if image_name not in catalog:
        raise DatasetError(f"image {image_name!r} is not in {images}")
    image = catalog[image_name]
    bundles = sorted(p.name for p in source.iterdir() if (p / "task.json").is_file())
    chosen = list(select) if select is not None else bundles
    missing = [t for t in chosen if t not in bundles]
    if missing or not chosen:
        raise DatasetError(f"no task bundle for {missing or 'any task'} in {source}")
    # The packages hold the reference solutions, the workspaces the tasks'
    # lowers (the helper mounts them as root; inside, the agent reads /task
    # through the files' own modes): on the host both are root's and the
    # services' only.
    for root in (packages_root, workspaces_root):
        private_dir(root)
    tasks = []
    for task_id in chosen:
        bundle = source / task_id
        meta = json.loads((bundle / "task.json").read_text())
        if set(meta) != TASK_FIELDS or meta["task_id"] != task_id:
            raise DatasetError(
                f"{bundle}/task.json: needs exactly {sorted(TASK_FIELDS)} and "
                "task_id equal to its directory"
            )
        package = Path(packages_root) / task_id
        package.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle / "task.json", package / "task.json")
        if (bundle / "reference").is_dir():
            shutil.rmtree(package / "reference", ignore_errors=True)
            shutil.copytree(bundle / "reference", package / "reference")
        workspace = Path(workspaces_root) / task_id
        workspace.mkdir(parents=True, exist_ok=True)
        os.chmod(workspace, 0o755)
        _copy_public(bundle / "public", workspace / "task")
        _install_private(
            bundle / "private", Path(private_root), task_id, account.pw_uid, account.pw_gid
        )
        tasks.append(
            {
                "task_id": task_id,
                "data": {
                    "title": meta["title"],
                    "metric": meta["metric"],
                    "statement": meta["statement"],
                    "baseline_score": meta["baseline_score"],
                    "reference_score": meta["reference_score"],
                    "image": {"name": image.name, "digest": image.digest, "hash": image.hash},
                    "workspace_sha256": sha256_tree(workspace),
                    "answers_sha256": answers_hash(bundle / "private"),
                },
            }
        )
    sampling: dict = {"order": "bundles" if select is None else "select"}
    if validate:
        from environments.autoresearch import validate as checks

        sampling["validation"] = checks.validate(
            chosen, source, Path(workspaces_root), image, helper_socket
        )
    body = manifest.build(
        "autoresearch", tasks, sampling=sampling, files={"images": images}, created_by=CREATED_BY
    )
    manifest.write(output, body)
    return body


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m camg.prepare --environment autoresearch",
        description="Install task bundles into the three roots and write the manifest.",
    )
    ap.add_argument("--source", required=True, help="directory of task bundles")
    ap.add_argument("--packages-root", required=True)
    ap.add_argument("--workspaces-root", required=True)
    ap.add_argument("--private-root", required=True)
    ap.add_argument("--images", required=True, help="materialized-images.json")
    ap.add_argument("--image", default="camg/demo-autoresearch")
    ap.add_argument("--grader-user", default="camg-grader")
    ap.add_argument("--output", required=True)
    ap.add_argument("--select", help="file of task ids, one a line, in serving order")
    ap.add_argument(
        "--validate",
        action="store_true",
        help="refuse tasks whose test rows are readable in the image or workspace, "
        "on which a no-learning baseline earns reward (and, with "
        "--helper-socket, whose baseline/reference misbehave)",
    )
    ap.add_argument("--helper-socket", help="the helper to run baseline and reference in")
    args = ap.parse_args(argv)
    try:
        select = None
        if args.select:
            select = [
                line.strip()
                for line in Path(args.select).read_text().splitlines()
                if line.strip() and not line.startswith("#")
            ]
        body = prepare(
            source=args.source,
            packages_root=args.packages_root,
            workspaces_root=args.workspaces_root,
            private_root=args.private_root,
            images=args.images,
            image_name=args.image,
            output=args.output,
            grader_user=args.grader_user,
            select=select,
            validate=args.validate,
            helper_socket=args.helper_socket,
        )
    except (CamgError, OSError, ValueError) as exc:
        print(f"camg.prepare: {exc}", file=sys.stderr)
        return 2
    print(f"camg.prepare: wrote {args.output} with {len(body['tasks'])} autoresearch task(s)")
    from environments.autoresearch.metrics import HIGHER_IS_BETTER

    metric = {t["task_id"]: t["data"]["metric"] for t in body["tasks"]}
    validation = body.get("sampling", {}).get("validation", {})
    for task_id, record in validation.get("tasks", {}).items():
        found = record.get("battery") or {}
        if found:
            sign = 1 if HIGHER_IS_BETTER[metric[task_id]] else -1
            name = max(found, key=lambda n: (found[n]["reward"], sign * found[n]["score"]))
            print(
                f"camg.prepare: {task_id}: {len(found)} no-learning baselines, the best "
                f"{name} (score {found[name]['score']:.6g}) earns {found[name]['reward']:.4f} "
                "(each in the manifest's sampling.validation)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
