"""Task layers: read-only overlay lowers built once per task branch.

Two layers per task, both stacked over the materialized image rootfs:

* agent  — ``/testbed``: the branch tip's tree as a fresh repository with one
  parentless commit and nothing else (no other branch, no reflog, no packed
  refs, no remote), owned by the agent uid. Beside it a root-only copy of
  that repository's git directory (``/var/lib/camg-task/git``, mode 0700):
  the agent's diff is taken with it, so rewriting or deleting /testbed/.git
  can neither forge nor block the submission.
* grader — ``/testbed``: the task branch cloned from the mirror and checked
  out at the tip's parent, which restores the removed FAIL_TO_PASS tests
  (SWE-smith's "branch tip, then HEAD~1").

An image may ship a workspace of its own at /testbed: SWE-smith images carry
a clone of the repository (with the history that holds the fix) plus what
installing it built in place (compiled extensions, egg-info). Each layer's
``.git`` is overlay-opaque, so only our repository is visible, and every
file the image's clone tracks that our tree lacks gets a whiteout, so the
removed tests and deleted files stay gone; untracked build artifacts of
the image keep showing through, as the tests need them -- except what
was compiled, cached or copied from the clean sources: the image's
bytecode (``__pycache__``, ``*.pyc``/``*.pyo``), test and tool caches
(``.pytest_cache``...), build output (``build/lib*``, ``dist/``), eggs, and
non-editable copies of the project's packages in the image's
site-packages are whited out in both layers (a pyc of the clean
module, compared with ``compile()`` of the visible one, names the fixed
function; environments/coding/leaks.py checks for every kind). Python recompiles
from the visible sources. Compiled extensions and egg-info stay: the tests
need them, and neither carries a Python function body.

This module is what the service loads: where a task's layers live and
``verified``, which checks them against their stamp. Building needs root
(ownership, trusted.* xattrs) and runs git on what images and mirrors ship;
it happens only in preparation (``build_layers_as_root`` in
environments/coding/prepare_layers.py, run by ``python -m camg.prepare
--environment coding`` as root), never in the service: a missing layer
stops the service's start with the command that builds it, and reset only
names the directory as a lower.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from camg.errors import ConfigError, PreparationMissing
from environments.coding.mirrors import TaskRef, git

AGENT_UID = 2000
AGENT_GID = 2000
WORKDIR = "testbed"
PRIVATE_GIT = "var/lib/camg-task/git"
STAMP = "camg-layer.json"
FORMAT = 5
GUARD_FILE = "opt/camg-grader/camg_guard.py"  # grader_scripts.GUARD_DIR, in the grader layer


@dataclasses.dataclass(frozen=True)
class TaskLayers:
    agent: str  # lower dir holding testbed/ and the private git dir
    grader: str  # lower dir holding testbed/ at the tests commit
    snapshot: str  # the agent repo's only commit


def guard_digest() -> str:
    from camg.config.hashing import sha256_file

    return sha256_file(guard_source()).split(":")[-1]


def guard_source() -> Path:
    from camg.grading.guard_verdict import GUARD_FILE

    return Path(GUARD_FILE)


def layer_dir(root: str | os.PathLike, ref: TaskRef, image_key: str = "") -> Path:
    image = image_key.split(":")[-1][:12] or "none"
    return Path(root) / ref.branch / f"{ref.tip[:16]}-{image}-v{FORMAT}-g{guard_digest()[:8]}"


PREPARE_STEP = "python -m camg.prepare --environment coding (as root)"


def verified(
    root: str | os.PathLike, ref: TaskRef, *, privileged: bool = True, image_key: str = ""
) -> TaskLayers:
    """The task's layers as preparation built them, checked against their stamp.

    Missing layers raise PreparationMissing naming the preparation command:
    the service never builds them. ``privileged=False`` accepts only layers
    built without root (tests of the git side); such layers are never
    accepted where ``privileged=True`` is asked for.
    """
    base = layer_dir(root, ref, image_key)
    if not (base / STAMP).is_file():
        raise PreparationMissing(
            f"{ref.branch}: task layers are missing under {base}", step=PREPARE_STEP
        )
    return _verify(base, ref, privileged, image_key)


def _verify(base: Path, ref: TaskRef, privileged: bool, image_key: str) -> TaskLayers:
    try:
        stamp = json.loads((base / STAMP).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{base}: unreadable layer stamp: {exc}") from None
    if stamp.get("privileged") is not privileged:
        raise ConfigError(
            f"{base}: layers were built {'without' if privileged else 'with'} root; rebuild them"
        )
    # The layers are a function of the commits, not of where the mirror lives.
    identity = {k: v for k, v in ref.to_data().items() if k != "mirror"}
    recorded = {k: v for k, v in (stamp.get("ref") or {}).items() if k != "mirror"}
    if stamp.get("format") != FORMAT or recorded != identity or stamp.get("image") != image_key:
        raise ConfigError(
            f"{base}: layers were built for another branch state "
            f"({stamp.get('ref')}, expected {ref.to_data()})"
        )
    agent, grader = base / "agent", base / "grader"
    tree = git(agent / WORKDIR, "rev-parse", "HEAD^{tree}").strip()
    head = git(agent / WORKDIR, "rev-parse", "HEAD").strip()
    if tree != stamp["tree"] or head != stamp["snapshot"]:
        raise ConfigError(f"{base}: agent layer does not match its stamp")
    # The private copy is root-only on purpose; the unprivileged service
    # cannot (and need not) read it, root checks it too.
    if (
        os.access(agent / PRIVATE_GIT, os.R_OK | os.X_OK)
        and git(agent / PRIVATE_GIT, "rev-parse", "HEAD").strip() != head
    ):
        raise ConfigError(f"{base}: the layer's private git directory does not match")
    check_grader(base, grader, ref, privileged)
    return TaskLayers(str(agent), str(grader), stamp["snapshot"])


def check_grader(base: Path, grader: Path, ref: TaskRef, privileged: bool) -> None:
    """A grader layer is at its tests commit and holds this checkout's guard
    (root-owned and not writable, when built as root)."""
    if git(grader / WORKDIR, "rev-parse", "HEAD").strip() != ref.tests:
        raise ConfigError(f"{base}: grader layer is not at {ref.tests}")
    guard = grader / GUARD_FILE
    from camg.config.hashing import sha256_file

    if not guard.is_file() or sha256_file(guard).split(":")[-1] != guard_digest():
        raise ConfigError(f"{base}: the grader layer's guard plugin is missing or changed")
    if privileged and (guard.stat().st_uid != 0 or guard.stat().st_mode & 0o022):
        raise ConfigError(f"{base}: the guard plugin must be root-owned and not writable")
