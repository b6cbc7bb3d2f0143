"""Prepared manifests: the task selection a preparation step hands to
``camg.configure``.

A manifest is one JSON file::

    {
      "format": "camg-manifest/1",
      "environment": "coding",
      "created_by": "camg.prepare 0.1.0",
      "sampling": {...},            # preserved exactly; meaning is the env's
      "tasks": [{"task_id": "...", "data": {...}}, ...],   # served in this order
      "files": {"label": {"path": "/abs/path", "sha256": "sha256:..."}},
      "variants": [...]             # optional: impossible variants (camg.config.variants)
    }

``files`` names whatever decides a reward beyond the rows (product pool,
index, mirrors, materialized images); ``camg.configure`` and
``camg.serve --check-config`` re-hash each of them. Task order is never
changed: trainers rely on it for reproducible schedules. ``variants`` are
private grader material of the tasks they name as origin: never listed,
served under their origin's id (camg.config.variants).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from camg import atomic
from camg.config.hashing import sha256_json, sha256_path, verify_recorded
from camg.config.variants import Variant
from camg.config.variants import parse as parse_variants
from camg.environment import Task
from camg.errors import ConfigError, DatasetError

FORMAT = "camg-manifest/1"
_TASK_ID_MAX = 256


@dataclasses.dataclass(frozen=True)
class Manifest:
    environment: str
    tasks: tuple[Task, ...]
    sampling: Mapping[str, Any]
    files: Mapping[str, Mapping[str, str]]
    created_by: str
    variants: tuple[Variant, ...] = ()

    @property
    def task_ids(self) -> list[str]:
        return [t.task_id for t in self.tasks]

    def selection_hash(self) -> str:
        """Hash of the task selection: ids, order, rows and sampling, and the
        variants where there are any (a manifest without them hashes as it
        did before they existed)."""
        body: dict[str, Any] = {
            "tasks": [{"task_id": t.task_id, "data": t.data} for t in self.tasks],
            "sampling": self.sampling,
        }
        if self.variants:
            body["variants"] = [v.to_data() for v in self.variants]
        return sha256_json(body)

    def verify_files(self) -> None:
        """Re-hash every recorded file; raise ConfigError naming a mismatch."""
        for label, entry in self.files.items():
            verify_recorded(
                f"manifest file {label!r}", entry["path"], entry["sha256"], since="preparation"
            )


def build(
    environment: str,
    tasks: Sequence[Mapping[str, Any]],
    *,
    sampling: Mapping[str, Any],
    files: Mapping[str, str | os.PathLike],
    created_by: str,
    variants: Sequence[Variant] = (),
) -> dict:
    """The JSON body of a manifest; ``files`` maps label -> path to hash now."""
    tasks = [dict(t) for t in tasks]
    _check_tasks(tasks, "manifest")
    raw_variants = [v.to_data() for v in variants]
    parse_variants(raw_variants, [t["task_id"] for t in tasks], "manifest")
    body = {
        "format": FORMAT,
        "environment": environment,
        "created_by": created_by,
        "sampling": dict(sampling),
        "tasks": [{"task_id": t["task_id"], "data": t["data"]} for t in tasks],
        "files": {
            label: {"path": str(Path(p).resolve()), "sha256": sha256_path(p)}
            for label, p in files.items()
        },
    }
    if raw_variants:
        body["variants"] = raw_variants
    return body


def write(path: str | os.PathLike, body: Mapping[str, Any]) -> None:
    """Write atomically, so a crash never leaves a half manifest behind.

    A manifest carries task data, references among them: root's and the
    services' group's only. Its directory is the caller's to close (it may
    also be the way to, say, AutoResearch's answers for the grader's uid).
    """
    from camg.config.host_private import to_services

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, body, mode=0o640)
    to_services(path)


def load(path: str | os.PathLike) -> Manifest:
    try:
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read manifest {path}: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a {FORMAT} manifest")
    unknown = set(body) - {
        "format",
        "environment",
        "created_by",
        "sampling",
        "tasks",
        "files",
        "variants",
    }
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ConfigError(f"{path}: tasks must be a non-empty list")
    _check_tasks(tasks, str(path))
    files = body.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("path"), str) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise ConfigError(f"{path}: files must map labels to {{path, sha256}}")
    sampling = body.get("sampling", {})
    if not isinstance(sampling, dict):
        raise ConfigError(f"{path}: sampling must be an object")
    try:
        variants = parse_variants(body.get("variants"), [t["task_id"] for t in tasks], str(path))
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    return Manifest(
        environment=str(body.get("environment")),
        tasks=tuple(Task(t["task_id"], t["data"]) for t in tasks),
        sampling=sampling,
        files=files,
        created_by=str(body.get("created_by", "")),
        variants=variants,
    )


def _check_tasks(tasks: Sequence[Any], where: str) -> None:
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        if not isinstance(task, Mapping) or set(task) != {"task_id", "data"}:
            raise DatasetError(f"{where}: task #{index} must have exactly task_id and data")
        task_id = task["task_id"]
        if (
            not isinstance(task_id, str)
            or not task_id
            or len(task_id) > _TASK_ID_MAX
            or not task_id.isprintable()
            or "/" in task_id
        ):
            raise DatasetError(f"{where}: task #{index} has an invalid task_id {task_id!r}")
        if task_id in seen:
            raise DatasetError(f"{where}: task id {task_id!r} appears twice")
        if not isinstance(task["data"], Mapping):
            raise DatasetError(f"{where}: task {task_id!r}: data must be an object")
        seen.add(task_id)
