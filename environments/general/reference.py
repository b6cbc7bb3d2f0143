"""General's reference solutions: what ``camg_client --policy oracle`` plays.

Upstream's MiMo rows carry no solution, so a task has one only when its
preparation was given it (``camg.prepare --environment general
--references DIR``; the demo's builder writes DIR): the prepared task data
then holds ``reference``, either

* ``{"patch": TEXT}`` (opensource-code: the gold fix, as a diff from the
  task's base), played as shell actions that append the base64 patch to a
  file in chunks (a command holds at most 16000 characters), one ``git
  apply`` from the repository, then ``finish`` (the MiMo verifier grades);
* ``{"actions": [...]}`` (general_agent: the shell/tool actions that solve
  the task, ending with ``finish`` and the reference answer), played as is.

The reference lives in the service's manifest only: never in a task image,
a container or an observation; the service hands it out only where the
deployment enables ``references`` (GET /episodes/{id}/reference).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from camg.errors import DatasetError, NotFound
from camg.sandboxes.shell_reference import shipped
from environments.general.schemas import MAX_COMMAND

STORE = "/tmp/.camg-reference.b64"


def plan(task_id: str, data: Mapping[str, Any]) -> list[dict]:
    """Every action of the task's reference solution, in order."""
    reference = data.get("reference")
    if not isinstance(reference, Mapping):
        raise NotFound(
            f"general task {task_id!r} was prepared without a reference solution "
            "(camg.prepare --environment general --references DIR)"
        )
    if "actions" in reference:
        return [dict(a) for a in reference["actions"]]
    return shipped(
        str(reference["patch"]).encode(),
        STORE,
        f"base64 -d {STORE} | git apply && rm -f {STORE}",
        max_command=MAX_COMMAND,
    )


def load(directory: str | Path, task_id: str, kind: str) -> dict | None:
    """A task's reference from a references directory (the demo builder's
    layout): ``gold/<id>.patch`` for opensource-code, ``<id>.oracle.json``
    (a list of actions ending with finish) for general_agent; None if absent."""
    directory = Path(directory)
    if kind == "opensource-code":
        path = directory / "gold" / f"{task_id}.patch"
        return {"patch": path.read_text()} if path.is_file() else None
    path = directory / f"{task_id}.oracle.json"
    if not path.is_file():
        return None
    try:
        actions = json.loads(path.read_text())
    except ValueError as exc:
        raise DatasetError(f"{path}: not JSON ({exc})") from None
    if (
        not isinstance(actions, list)
        or not actions
        or not all(isinstance(a, dict) for a in actions)
        or actions[-1].get("operation") != "finish"
    ):
        raise DatasetError(f"{path}: must be a list of actions ending with finish")
    return {"actions": actions}
