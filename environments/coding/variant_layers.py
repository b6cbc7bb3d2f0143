"""An impossible variant's grader layer (camg.config.variants): where it lives and
what the service checks of it.

A Coding variant differs from its task only in one test file of the tests
commit (environments/coding/mutations.py). Its agent sees the task's own
agent layer. Its grader layer is the task's, rebuilt around two commits
preparation makes from the task's own: the tests commit with the mutated
file (author, committer, dates and message of the "Bug Patch" commit, a
new tree) and the tip on top of it (the "Remove F2P Tests" commit's, with
that parent). The branch has the task's name and points at the new tip,
HEAD is detached at the new tests commit, and nothing else of the task's
commits is left in the repository: code that runs during grading reads
the same shape of repository, refs and layer path as a real task's.

The variant's ``TaskRef`` is the task's mirror and branch with those two
commits; its layers live where a task's with that tip would
(environments.coding.layers.layer_dir), with only ``grader/``. Built by
preparation as root (environments/coding/prepare_variants.py); the service
only checks them here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from camg.errors import ConfigError, PreparationMissing
from environments.coding.layers import (
    FORMAT,
    PREPARE_STEP,
    STAMP,
    check_grader,
    layer_dir,
)
from environments.coding.mirrors import TaskRef

KIND = "variant"


def variant_ref(origin: TaskRef, data: Mapping[str, Any]) -> TaskRef:
    """The variant's ref from its origin's and its manifest data."""
    return TaskRef(origin.mirror, origin.branch, str(data["tip"]), str(data["tests"]))


def verified(
    root: str, origin: TaskRef, ref: TaskRef, *, image_key: str, privileged: bool = True
) -> str:
    """The variant's grader layer as preparation built it; PreparationMissing
    naming the preparation command when it is not there."""
    base = layer_dir(root, ref, image_key)
    if not (base / STAMP).is_file():
        raise PreparationMissing(
            f"{origin.branch}: the grader layer of an impossible variant is missing under {base}",
            step=PREPARE_STEP,
        )
    try:
        stamp = json.loads((base / STAMP).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{base}: unreadable layer stamp: {exc}") from None
    identity = {k: v for k, v in ref.to_data().items() if k != "mirror"}
    origin_identity = {k: v for k, v in origin.to_data().items() if k != "mirror"}
    recorded = {k: v for k, v in (stamp.get("ref") or {}).items() if k != "mirror"}
    recorded_origin = {k: v for k, v in (stamp.get("origin") or {}).items() if k != "mirror"}
    if (
        stamp.get("format") != FORMAT
        or stamp.get("kind") != KIND
        or recorded != identity
        or recorded_origin != origin_identity
        or stamp.get("image") != image_key
        or stamp.get("privileged") is not privileged
    ):
        raise ConfigError(f"{base}: layer was built for another variant or task state")
    grader = base / "grader"
    check_grader(base, grader, ref, privileged)
    return str(grader)


def base_dir(root: str, ref: TaskRef, image_key: str) -> Path:
    return layer_dir(root, ref, image_key)
