"""``python -m camg.prepare --environment general``: MiMo rows -> task folders,
Parquet tables and a prepared manifest.

    python -m camg.prepare --environment general \\
        --code-rows code.parquet --general-rows general/train.parquet \\
        --envs general/envs --images image-mapping.jsonl \\
        --output-dir /srv/camg/data/general [--select ids.txt] [--limit N] [--seed S]

Rows are MiMo-V2.6-RL-oss rows in any of the shapes the ports use: a column
``instance`` (dict, NeMo-Gym's rows), ``instance_json`` (string) or
``extra_info.instance_json`` (the raw parquet), ``.parquet`` or ``.jsonl``.
Every instance is validated for its dataset type (opensource-code: the eight
fields; general_agent: its fields and a task folder ``<envs>/<id>``).
``--images`` maps each row's ``docker_image`` to an image pinned by digest
(``image-mapping.jsonl``: ``{"dataset_image", "dockerhub_image"}`` lines).
An opensource-code task whose test command the verifier's test guard
cannot cover (``guard_problem``: every command its ``mimo_test_command.sh``
runs, ``test_commands.json``, must start pytest and none may set the
variables that load the guard) is marked ``test_guard: {"covered": false,
"reason"}`` in its data; the service lists such tasks in /metadata and
their outcome records say so (real rows include ``npx jest`` tasks). The
selection keeps ids and order (the --select file's, else code rows then
general rows as given); ``--limit`` cuts it. Output: ``code.parquet`` and
``general.parquet`` (the selected rows: instance_id, dataset_type,
instance_json, image), ``envs/<id>/`` (copied task folders) and
``manifest.json`` recording all of them and the image mapping by hash.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.config.host_private import private_dir
from camg.errors import CamgError, DatasetError
from environments.general import reference

CREATED_BY = "camg.prepare general 0.1.0"
CODE_FIELDS = (
    "dataset_type",
    "docker_image",
    "cwd",
    "instance_id",
    "problem_statement",
    "test_patch",
    "test_command",
    "verifier_timeout_sec",
)
GENERAL_FIELDS = (
    "instance_id",
    "dataset_type",
    "docker_image",
    "env_task_dir",
    "cwd",
    "problem_statement",
)
KIND_FIELDS = {"opensource-code": CODE_FIELDS, "general_agent": GENERAL_FIELDS}


def read_rows(path: str | Path) -> list[dict]:
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise DatasetError(f"{path}:{lineno}: not JSON ({exc})") from None
    return rows


def instance_of(row: dict, where: str) -> dict:
    if isinstance(row.get("instance"), dict):
        instance = row["instance"]
    else:
        raw = row.get("instance_json") or (row.get("extra_info") or {}).get("instance_json")
        if not isinstance(raw, str):
            raise DatasetError(f"{where}: no instance, instance_json or extra_info.instance_json")
        try:
            instance = json.loads(raw)
        except ValueError:
            raise DatasetError(f"{where}: instance_json is not JSON") from None
    kind = instance.get("dataset_type")
    if kind not in KIND_FIELDS:
        raise DatasetError(
            f"{where}: dataset_type {kind!r} is not served by General ({', '.join(KIND_FIELDS)})"
        )
    for field in KIND_FIELDS[kind]:
        if field not in instance or instance[field] in (None, ""):
            raise DatasetError(f"{where} ({instance.get('instance_id')!r}): field {field} missing")
    if kind == "opensource-code" and not str(instance["cwd"]).startswith("/"):
        raise DatasetError(f"{where}: cwd must be absolute")
    return instance


_PYTEST = re.compile(r"(?:^|[\s/])(?:pytest|py\.test)(?:\s|$)|-m\s+pytest\b")
_GUARD_VARS = re.compile(
    r"\b(?:PYTEST_ADDOPTS|PYTEST_PLUGINS|PYTEST_DISABLE_PLUGIN_AUTOLOAD|PYTHONPATH)\b"
    r"|\bno:camg_guard\b|\bcamg_guard\b"
)


def patch_file(patch: str, path: str) -> str | None:
    """The added text of ``path`` in a unified diff (None when absent)."""
    lines, inside, found = [], False, False
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            inside = line.endswith(f" b/{path}")
            found = found or inside
        elif inside and line.startswith("+") and not line.startswith("+++"):
            lines.append(line[1:])
    return "\n".join(lines) if found else None


def test_commands(instance: dict) -> list[str]:
    """The commands the test command runs: test_commands.json of the test
    patch when the test command is its mimo_test_command.sh, else itself."""
    command = str(instance["test_command"])
    if command.strip().endswith("mimo_test_command.sh"):
        text = patch_file(str(instance["test_patch"]), "test_commands.json")
        try:
            listed = json.loads(text) if text is not None else None
        except ValueError:
            listed = None
        if isinstance(listed, dict):  # upstream's shape: {"test_commands": [...]}
            listed = listed.get("test_commands")
        if isinstance(listed, list) and all(isinstance(c, str) for c in listed):
            return listed
        return []
    return [command]


def guard_problem(instance: dict) -> str | None:
    """Why the verifier's test guard (camg/grading/guard/camg_guard.py, a pytest
    plugin) cannot decide this task's grade, or None: a command that does
    not start pytest would never report to it (every grade null), one that
    sets the guard's variables would run without it."""
    commands = test_commands(instance)
    if not commands:
        return "its test commands (test_commands.json of the test patch) cannot be read"
    script = patch_file(str(instance["test_patch"]), "mimo_test_command.sh") or ""
    for command in commands:
        if not _PYTEST.search(command):
            return f"test command {shlex.quote(command)[:200]} does not run pytest"
    for text in commands + [script]:
        match = _GUARD_VARS.search(text)
        if match:
            return f"its test command sets {match.group(0)}, which loads the test guard"
    return None


def read_selection(path: str | Path) -> list[str]:
    """Ids, one per line, in the order to serve them ('#' comments allowed)."""
    ids: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            value = line.split("#", 1)[0].strip()
            if value in ids:
                raise DatasetError(f"{path}:{lineno}: id {value!r} is selected twice")
            if value:
                ids.append(value)
    if not ids:
        raise DatasetError(f"{path}: selects no task")
    return ids


def read_images(path: str | Path) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for index, row in enumerate(read_rows(path)):
        source, target = row.get("dataset_image"), row.get("dockerhub_image")
        if not isinstance(source, str) or not isinstance(target, str) or "@sha256:" not in target:
            raise DatasetError(
                f"{path}: line {index + 1}: need dataset_image and a dockerhub_image "
                "pinned by digest (REPO@sha256:HEX)"
            )
        mapping[source] = target
    return mapping


def prepare_general(
    *,
    code_rows: str | None,
    general_rows: str | None,
    envs: str | None,
    images: str,
    output_dir: str | Path,
    select: str | None = None,
    limit: int | None = None,
    seed: int | None = None,
    references: str | Path | None = None,
) -> dict:
    """``references``: a directory of reference solutions (reference.load's
    layout); each task found there gets ``reference`` in its data, which the
    service serves only where the deployment enables references."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from camg.config.hashing import sha256_file

    out = Path(output_dir)
    mapping = read_images(images)
    chosen: list[dict] = []
    seen: set[str] = set()
    for _label, path in (("code", code_rows), ("general", general_rows)):
        if path is None:
            continue
        for index, row in enumerate(read_rows(path)):
            instance = instance_of(row, f"{path} row {index}")
            if instance["instance_id"] in seen:
                raise DatasetError(
                    f"{path} row {index}: instance_id {instance['instance_id']!r} twice"
                )
            seen.add(instance["instance_id"])
            chosen.append(instance)
    if not chosen:
        raise DatasetError("no rows given (--code-rows and/or --general-rows)")
    if select is not None:
        by_id = {i["instance_id"]: i for i in chosen}
        wanted = read_selection(select)
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise DatasetError(f"{select}: selected id {missing[0]!r} is in no rows file")
        chosen = [by_id[i] for i in wanted]
    if limit is not None:
        if limit < 1:
            raise DatasetError("--limit must be at least 1")
        chosen = chosen[:limit]
    # Task folders, tables and the references (gold patches, oracle lists)
    # in the manifest: root's and the services' only.
    private_dir(out)
    shutil.rmtree(out / "envs", ignore_errors=True)
    tasks, files = [], {}
    tables: dict[str, list[dict]] = {"opensource-code": [], "general_agent": []}
    for instance in chosen:
        task_id, kind = instance["instance_id"], instance["dataset_type"]
        image = mapping.get(instance["docker_image"])
        if image is None:
            raise DatasetError(
                f"{task_id}: docker_image {instance['docker_image']!r} is not in {images}"
            )
        data = {"kind": kind, "instance_id": task_id, "image": image, "instance": instance}
        if kind == "opensource-code":
            problem = guard_problem(instance)
            data["test_guard"] = {
                "covered": problem is None,
                **({"reason": problem} if problem else {}),
            }
        if references is not None:
            found = reference.load(references, task_id, kind)
            if found is not None:
                data["reference"] = found
        if kind == "general_agent":
            if envs is None:
                raise DatasetError("general_agent rows need --envs (the task folders)")
            source = Path(envs) / task_id
            if not (source / "instance.json").is_file() or not (source / "workspace").is_dir():
                raise DatasetError(
                    f"{task_id}: task folder {source} lacks instance.json or workspace/"
                )
            shutil.copytree(source, out / "envs" / task_id, symlinks=False)
            files[f"env:{task_id}"] = out / "envs" / task_id
            data["task_dir"] = str((out / "envs" / task_id).resolve())
        tasks.append({"task_id": task_id, "data": data})
        tables[kind].append(
            {
                "instance_id": task_id,
                "dataset_type": kind,
                "instance_json": json.dumps(instance, ensure_ascii=False),
                "image": image,
            }
        )
    schema = pa.schema(
        [
            ("instance_id", pa.string()),
            ("dataset_type", pa.string()),
            ("instance_json", pa.string()),
            ("image", pa.string()),
        ]
    )
    for kind, name in (("opensource-code", "code.parquet"), ("general_agent", "general.parquet")):
        pq.write_table(pa.Table.from_pylist(tables[kind], schema=schema), out / name)
        files[name.split(".")[0] + "_table"] = out / name
    files["images"] = Path(images)
    sampling = {
        "order": "select" if select is not None else "rows",
        "seed": seed,
        "limit": limit,
        "select_sha256": sha256_file(select) if select is not None else None,
    }
    body = manifest.build("general", tasks, sampling=sampling, files=files, created_by=CREATED_BY)
    manifest.write(out / "manifest.json", body)
    return body


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m camg.prepare --environment general",
        description="Prepare General's task folders, tables and manifest.",
    )
    ap.add_argument("--code-rows", help="opensource-code rows (.parquet or .jsonl)")
    ap.add_argument("--general-rows", help="general_agent rows (.parquet or .jsonl)")
    ap.add_argument("--envs", help="directory of general_agent task folders (<envs>/<instance_id>)")
    ap.add_argument("--images", required=True, help="image-mapping.jsonl (images pinned by digest)")
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--select", help="file of instance ids to serve, in order")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument(
        "--references",
        help="reference solutions (gold/<id>.patch, <id>.oracle.json) "
        "for camg_client --policy oracle",
    )
    args = ap.parse_args(argv)
    try:
        body = prepare_general(
            code_rows=args.code_rows,
            general_rows=args.general_rows,
            envs=args.envs,
            images=args.images,
            output_dir=args.output_dir,
            select=args.select,
            limit=args.limit,
            seed=args.seed,
            references=args.references,
        )
    except (CamgError, OSError) as exc:
        print(f"camg.prepare: {exc}", file=sys.stderr)
        return 2
    print(
        f"camg.prepare: wrote {Path(args.output_dir) / 'manifest.json'} with "
        f"{len(body['tasks'])} general task(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
