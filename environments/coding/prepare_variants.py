"""Building Coding's impossible variants: preparation only, as root.

``python -m camg.prepare --environment coding --variants --validate``
makes, for each selected task, the mutations environments/coding/mutations.py
finds (one ``one_off``, one ``conflicting``), the two commits each needs
(environments/coding/variant_layers.py says which) and the variant's
grader layer; validation then grades them inverted (environments/coding/validate.py)
and only the variants the gold fix and the no-op both fail are written to
the manifest. The service only checks what this built.

Commits are made with git's plumbing from the task's own raw commit
objects (only the tree, or the parent, changed), so the same mutation
always makes the same commits: a variant's id, its layer directory and
its commits are the same every time preparation runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from camg.config import variants
from camg.config.hashing import sha256_bytes
from camg.config.host_private import private_dir
from camg.errors import ConfigError, PreparationMissing
from environments.coding import mutations
from environments.coding.layers import AGENT_GID, AGENT_UID, FORMAT, PREPARE_STEP, STAMP, WORKDIR
from environments.coding.mirrors import TaskRef
from environments.coding.prepare_layers import (
    _SAFE_GIT_ARGS,
    _SAFE_GIT_ENV,
    _build_grader,
    _chown_tree,
    _mask,
    hide_build_output,
    image_tracked,
    install_built,
)
from environments.coding.rows import Row
from environments.coding.variant_layers import KIND, base_dir, verified


@dataclasses.dataclass(frozen=True)
class Built:
    """A variant made and its grader layer built (not yet validated)."""

    variant: variants.Variant
    mutation: mutations.Mutation
    ref: TaskRef
    grader: str  # the grader layer's directory


def _git(repo: str | Path, *args: str, input: bytes | None = None, index: str | None = None):
    env = {**os.environ, **_SAFE_GIT_ENV}
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    proc = subprocess.run(
        ["git", *_SAFE_GIT_ARGS, "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise ConfigError(
            f"git {' '.join(args[:3])} in {repo} failed: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout


def read_tests_file(ref: TaskRef, path: str) -> bytes | None:
    """A file of the task's tests commit (None: not there)."""
    try:
        kind = _git(ref.mirror, "cat-file", "-t", f"{ref.tests}:{path}").strip()
    except ConfigError:
        return None
    if kind != b"blob":
        return None
    return _git(ref.mirror, "cat-file", "blob", f"{ref.tests}:{path}")


def find(row: Row, ref: TaskRef) -> list[mutations.Mutation]:
    """The task's mutations, one of each type where its tests allow."""
    found = []
    for kind in mutations.TYPES:
        made = mutations.mutate_task(
            row.fail_to_pass, lambda path: read_tests_file(ref, path), kind, row.pass_to_pass
        )
        if made is not None:
            found.append(made)
    return found


def commits(repo: str | Path, origin: TaskRef, mutation: mutations.Mutation) -> tuple[str, str]:
    """(tests, tip) of the variant, written into ``repo``'s objects: the
    tests commit with the mutated file, the tip on top of it."""
    listing = _git(repo, "ls-tree", origin.tests, "--", mutation.path).decode()
    mode = listing.split(" ", 1)[0] if listing else "100644"
    blob = _git(repo, "hash-object", "-w", "--stdin", input=mutation.source).decode().strip()
    with tempfile.TemporaryDirectory(prefix="camg-variant-index.") as scratch:
        index = str(Path(scratch) / "index")
        _git(repo, "read-tree", origin.tests, index=index)
        _git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{mutation.path}", index=index)
        tree = _git(repo, "write-tree", index=index).decode().strip()
    tests = _replace_header(_git(repo, "cat-file", "commit", origin.tests), b"tree", tree, None)
    tests_id = _git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=tests)
    tests_id_text = tests_id.decode().strip()
    tip = _replace_header(
        _git(repo, "cat-file", "commit", origin.tip), b"parent", tests_id_text, origin.tests
    )
    tip_id = _git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=tip)
    return tests_id_text, tip_id.decode().strip()


def _replace_header(raw: bytes, name: bytes, new: str, old: str | None) -> bytes:
    """The raw commit with its first ``name`` header set to ``new`` (it
    must be ``old`` where given); the rest byte for byte."""
    head, sep, message = raw.partition(b"\n\n")
    lines = head.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(name + b" "):
            if old is not None and line != name + b" " + old.encode():
                raise ConfigError(f"commit header {line!r} is not {name.decode()} {old}")
            lines[i] = name + b" " + new.encode()
            return b"\n".join(lines) + sep + message
    raise ConfigError(f"commit has no {name.decode()} header")


def plan(origin: TaskRef, mutation: mutations.Mutation) -> TaskRef:
    """The variant's ref, computed in a scratch repository that borrows the
    mirror's objects (nothing is written into the mirror)."""
    objects = _git(origin.mirror, "rev-parse", "--git-path", "objects").decode().strip()
    objects_dir = (Path(origin.mirror) / objects).resolve()
    with tempfile.TemporaryDirectory(prefix="camg-variant-plan.") as scratch:
        subprocess.run(
            ["git", "init", "-q", "--bare", "--template=", scratch],
            env={**os.environ, **_SAFE_GIT_ENV},
            check=True,
            capture_output=True,
        )
        (Path(scratch) / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (Path(scratch) / "objects" / "info" / "alternates").write_text(f"{objects_dir}\n")
        tests, tip = commits(scratch, origin, mutation)
    return TaskRef(origin.mirror, origin.branch, tip, tests)


def build_variant_layer_as_root(
    root: str | os.PathLike,
    origin: TaskRef,
    mutation: mutations.Mutation,
    *,
    image_rootfs: str | None = None,
    image_key: str = "",
    privileged: bool = True,
) -> tuple[TaskRef, str]:
    """The variant's ref and grader layer, built when missing, then verified."""
    ref = plan(origin, mutation)
    base = base_dir(str(root), ref, image_key)
    if os.geteuid() == 0 or not (base / STAMP).is_file():
        private_dir(root)
    if not (base / STAMP).is_file():
        _build(base, origin, ref, mutation, privileged, image_rootfs, image_key)
    return ref, verified(str(root), origin, ref, image_key=image_key, privileged=privileged)


def _build(
    base: Path,
    origin: TaskRef,
    ref: TaskRef,
    mutation: mutations.Mutation,
    privileged: bool,
    image_rootfs: str | None,
    image_key: str,
) -> None:
    if privileged and os.geteuid() != 0:
        raise PreparationMissing(
            f"{origin.branch}: building a variant's grader layer needs root", step=PREPARE_STEP
        )
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{base.name}.", dir=base.parent))
    try:
        tracked = image_tracked(image_rootfs) if image_rootfs else []
        _build_grader(tmp / "grader", origin, privileged)
        work = tmp / "grader" / WORKDIR
        made = commits(work, origin, mutation)
        if made != (ref.tests, ref.tip):
            raise ConfigError(f"{origin.branch}: the variant's commits differ from their plan")
        # The task's branch at the variant's tip, HEAD at its tests commit,
        # and nothing of the task's own two commits left to read: the
        # clone's reflogs (its clone and its checkout) are kept with the
        # variant's commits in the task's stead, refs stay loose, and the
        # task's commits are pruned, as a task's grader repository looks.
        logs = _take_logs(work / ".git")
        _git(work, "update-ref", f"refs/heads/{origin.branch}", ref.tip)
        _git(work, "checkout", "-q", "-f", "--detach", ref.tests)
        _git(work, "repack", "-a", "-d", "-q", "-n")
        _git(work, "prune", "--expire=now")
        for leftover in ("ORIG_HEAD", "FETCH_HEAD"):
            (work / ".git" / leftover).unlink(missing_ok=True)
        swap = {origin.tip.encode(): ref.tip.encode(), origin.tests.encode(): ref.tests.encode()}
        for rel, data in logs.items():
            for old, new in swap.items():
                data = data.replace(old, new)
            (work / ".git" / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / ".git" / rel).write_bytes(data)
        if privileged:
            _chown_tree(work, AGENT_UID, AGENT_GID)
        masked = _mask(work, tracked)
        hidden = hide_build_output(tmp / "grader", image_rootfs) if image_rootfs else 0
        (tmp / STAMP).write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "kind": KIND,
                    "ref": ref.to_data(),
                    "origin": origin.to_data(),
                    "privileged": privileged,
                    "image": image_key,
                    "mutation": mutation.to_data(),
                    "whiteouts": masked,
                    "hidden": hidden,
                }
            )
            + "\n"
        )
        install_built(tmp, base, "a variant's layer")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _take_logs(git_dir: Path) -> dict[str, bytes]:
    """The repository's reflog files (relative path -> bytes), removed."""
    logs = git_dir / "logs"
    taken = {
        str(path.relative_to(git_dir)): path.read_bytes()
        for path in sorted(logs.rglob("*"))
        if path.is_file()
    }
    shutil.rmtree(logs, ignore_errors=True)
    return taken


def make(
    root: str | os.PathLike,
    rows: Sequence[Row],
    refs: Sequence[TaskRef],
    images: Sequence,
    *,
    privileged: bool = True,
) -> tuple[list[Built], dict[str, str]]:
    """Every selected task's variants with their grader layers built; and,
    per task without any, why."""
    built: list[Built] = []
    skipped: dict[str, str] = {}
    for row, ref, image in zip(rows, refs, images, strict=True):
        found = find(row, ref)
        if not found:
            skipped[row.instance_id] = "no FAIL_TO_PASS assertion to mutate"
            continue
        for mutation in found:
            vref, grader = build_variant_layer_as_root(
                root,
                ref,
                mutation,
                image_rootfs=image.rootfs if privileged else None,
                image_key=image.hash,
                privileged=privileged,
            )
            data = {
                "tests": vref.tests,
                "tip": vref.tip,
                "path": mutation.path,
                "sha256": sha256_bytes(mutation.source),
                "FAIL_TO_PASS": list(mutation.fail_to_pass),
            }
            variant = variants.Variant(
                variants.variant_id(row.instance_id, vref.tests),
                row.instance_id,
                "impossible",
                mutation.to_data(),
                data,
            )
            built.append(Built(variant, mutation, vref, grader))
    return built, skipped
