"""Repository mirrors: which directory and which branch a row's task lives in.

The mirror of a row is the directory named by the last path component of its
``repo`` under the mirrors root; the task is the branch named exactly by
``instance_id``. Nothing here ever falls back to a default branch: a missing
branch is an error, at prepare time and again when the service starts.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from camg.errors import ConfigError, DatasetError
from environments.coding.rows import Row

# Mirrors are usually owned by whoever fetched them, not by the service user;
# git's ownership check would otherwise refuse to read them.
_GIT = (
    "git",
    "-c",
    "safe.directory=*",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.attributesFile=/dev/null",
)
# Nothing from the machine's or root's own git configuration either.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}


@dataclasses.dataclass(frozen=True)
class TaskRef:
    """Where a task's code is: mirror, branch, and the commits it must have."""

    mirror: str  # absolute path of the mirror repository
    branch: str  # == instance_id
    tip: str  # "Remove F2P Tests" commit: what the agent sees
    tests: str  # tip's parent ("Bug Patch"): tests restored, for grading

    def to_data(self) -> dict[str, str]:
        return {"mirror": self.mirror, "branch": self.branch, "tip": self.tip, "tests": self.tests}


def git(repo: str | os.PathLike, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(
        [*_GIT, "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env={**os.environ, **_GIT_ENV},
        check=False,
    )
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(
            proc.returncode, ["git", *args], proc.stdout, proc.stderr
        )
    return proc.stdout.decode()


def mirror_path(root: str | os.PathLike, row: Row) -> Path:
    """The mirror directory of ``row``; it must be inside ``root``."""
    root = Path(root).resolve()
    path = (root / row.mirror_name).resolve()
    if path.parent != root:
        raise DatasetError(f"{row.instance_id}: mirror {row.mirror_name!r} leaves {root}")
    if not path.is_dir():
        raise DatasetError(
            f"{row.instance_id}: no mirror directory {path} for repo {row.repo!r}", field="repo"
        )
    return path


def heads(mirror: Path) -> dict[str, str]:
    """branch name -> commit for every local branch of a mirror."""
    try:
        out = git(
            mirror, "for-each-ref", "--format=%(refname:lstrip=2) %(objectname)", "refs/heads/"
        )
    except subprocess.CalledProcessError as exc:
        raise DatasetError(
            f"{mirror} is not a readable git repository: "
            f"{exc.stderr.decode(errors='replace').strip()}"
        ) from None
    result = {}
    for line in out.splitlines():
        name, _, commit = line.rpartition(" ")
        result[name] = commit
    return result


def remote_tracking(mirror: Path, branch: str) -> str | None:
    """The remote-tracking ref holding ``branch``, if only a clone's remote has it."""
    try:
        out = git(mirror, "for-each-ref", "--format=%(refname)", "refs/remotes/")
    except subprocess.CalledProcessError:
        return None
    for ref in out.splitlines():
        if ref.split("/", 3)[-1] == branch:
            return ref
    return None


def resolve(root: str | os.PathLike, rows: Sequence[Row]) -> list[TaskRef]:
    """Check every row's mirror and branch; return their refs in row order.

    Rejects a missing branch, two rows naming one branch, and two repos
    that claim the same mirror directory (a conflicting identity).
    """
    owners: dict[Path, str] = {}
    branch_of: dict[tuple[Path, str], str] = {}
    cache: dict[Path, dict[str, str]] = {}
    refs = []
    for row in rows:
        mirror = mirror_path(root, row)
        if owners.setdefault(mirror, row.repo) != row.repo:
            raise DatasetError(
                f"{row.instance_id}: repos {owners[mirror]!r} and {row.repo!r} "
                f"both claim mirror {mirror}",
                field="repo",
            )
        key = (mirror, row.instance_id)
        if key in branch_of:
            raise DatasetError(
                f"branch {row.instance_id!r} of {mirror} is claimed by two rows",
                field="instance_id",
            )
        branch_of[key] = row.instance_id
        if mirror not in cache:
            cache[mirror] = heads(mirror)
        branches = cache[mirror]
        tip = branches.get(row.instance_id)
        if tip is None:
            remote = remote_tracking(mirror, row.instance_id)
            if remote:
                raise DatasetError(
                    f"{row.instance_id}: mirror {mirror} has this task only as the "
                    f"remote-tracking ref {remote} (a plain `git clone` of the SWE-smith "
                    "mirror), not as a local branch. Clone it with `git clone --mirror "
                    f"<url> {mirror}` (or run `git -C {mirror} fetch origin "
                    "'+refs/heads/*:refs/heads/*'`) and prepare again.",
                    field="instance_id",
                )
            raise DatasetError(
                f"{row.instance_id}: mirror {mirror} has no branch named {row.instance_id!r}",
                field="instance_id",
            )
        refs.append(
            TaskRef(str(mirror), row.instance_id, tip, _parent(mirror, row.instance_id, tip))
        )
    return refs


def _parent(mirror: Path, branch: str, tip: str) -> str:
    # SWE-smith's layout: the tip removes the F2P tests, its parent is the bug.
    try:
        return git(mirror, "rev-parse", "--verify", "--quiet", f"{tip}~1^{{commit}}").strip()
    except subprocess.CalledProcessError:
        raise DatasetError(
            f"{branch}: branch tip {tip} has no parent commit "
            "(expected 'Bug Patch' then 'Remove F2P Tests')",
            field="instance_id",
        ) from None


def verify(ref: TaskRef) -> None:
    """At service start: the branch still points where preparation recorded."""
    mirror = Path(ref.mirror)
    if not mirror.is_dir():
        raise ConfigError(f"{ref.branch}: mirror {mirror} is missing")
    current = heads(mirror).get(ref.branch)
    if current is None:
        raise ConfigError(f"{ref.branch}: mirror {mirror} no longer has branch {ref.branch!r}")
    if current != ref.tip:
        raise ConfigError(
            f"{ref.branch}: branch moved since preparation (recorded {ref.tip}, now {current})"
        )


def gold_diff(ref: TaskRef) -> bytes:
    """The task's gold fix as a diff of the tree the agent starts from:
    the "Bug Patch" commit reversed (what validation and the null proof's
    control grade)."""
    out = git(
        ref.mirror,
        "diff",
        "--binary",
        "--full-index",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        ref.tests,
        f"{ref.tests}~1",
    )
    return out.encode("utf-8", "surrogateescape")
