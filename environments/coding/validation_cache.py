"""What ``--validate`` proved of a task or an impossible variant, kept beside
its layers, so preparing the same selection again grades nothing again.

A result is kept under a key of everything that decides it: the layers'
commits and image, the test command, the listed tests, the diffs graded
and the sources of the grading itself (the eval script, the log's parse,
the screens, the guard). Change any of them and the key changes, and the
task is graded again. The file sits in the layer directory preparation
built as root (``camg-validated.json``, beside its stamp); the service
never reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from camg.config.hashing import sha256_bytes, sha256_json

FILE = "camg-validated.json"
#: the sources whose change must grade everything again (besides the guard)
_SOURCES = (
    "environments/coding/diff_paths.py",
    "environments/coding/episode.py",
    "environments/coding/grader_scripts.py",
    "environments/coding/integrity.py",
    "environments/coding/log_evaluation.py",
    "environments/coding/profiles.py",
    "environments/coding/validate.py",
    "camg/grading/code_screen.py",
    "camg/grading/code_screen_ast.py",
    "camg/grading/code_screen_names.py",
    "camg/grading/guard_verdict.py",
    "camg/grading/tamper_rules.py",
)


def _grading_sources() -> str:
    root = Path(__file__).resolve().parents[2]
    parts = {}
    for rel in _SOURCES:
        path = root / rel
        parts[rel] = sha256_bytes(path.read_bytes()) if path.is_file() else None
    return sha256_json(parts)


def key(prepared: Any, kind: str, **graded: Any) -> str:
    """The key of one validation of ``prepared`` (episode.Prepared): its
    commits, image, test command, listed tests, and ``graded`` (the diffs'
    digests, a variant's id...)."""
    from environments.coding.layers import guard_digest

    return sha256_json(
        {
            "kind": kind,
            "ref": {k: v for k, v in prepared.ref.to_data().items() if k != "mirror"},
            "image": prepared.image.hash,
            "agent": prepared.layers.snapshot,
            "test_cmd": prepared.profile.test_cmd,
            "fail_to_pass": list(prepared.row.fail_to_pass),
            "pass_to_pass": list(prepared.row.pass_to_pass),
            "guard": guard_digest(),
            "sources": _grading_sources(),
            "graded": graded,
        }
    )


def load(directory: str | os.PathLike, wanted: str) -> dict | None:
    try:
        body = json.loads((Path(directory) / FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("key") != wanted:
        return None
    result = body.get("result")
    return result if isinstance(result, dict) else None


def store(directory: str | os.PathLike, wanted: str, result: dict) -> None:
    """Keep ``result``; a directory we may not write costs the next run a
    grade, nothing else."""
    path = Path(directory) / FILE
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": wanted, "result": result}) + "\n")
        os.chmod(tmp, 0o640)
        tmp.replace(path)
    except OSError:
        pass
