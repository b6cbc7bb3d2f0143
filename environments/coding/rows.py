"""SWE-smith task rows: reading Parquet/JSONL and validating every field.

A row is trusted by nothing downstream until it passes ``validate``: its
instance_id becomes a git branch name and a directory name, its repo a
mirror directory, its patch is applied by git. A bad row raises
DatasetError naming the row index, its instance_id when known, and the field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from camg.errors import DatasetError

REQUIRED = (
    "instance_id",
    "repo",
    "patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "image_name",
    "problem_statement",
)
# Columns the published SWE-smith dataset carries besides the required ones;
# accepted and ignored. Anything else is a sign of the wrong file.
OPTIONAL = ("created_at", "base_commit")

_ID_MAX = 200
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Characters git refuses in a ref name, plus whitespace (git check-ref-format).
_REF_BAD = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


@dataclasses.dataclass(frozen=True)
class Row:
    instance_id: str
    repo: str
    patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    image_name: str
    problem_statement: str

    @property
    def mirror_name(self) -> str:
        """The mirror directory: the last path component of ``repo``."""
        return self.repo.rsplit("/", 1)[-1]

    def to_data(self) -> dict[str, Any]:
        """The row as it is recorded in the prepared manifest (SWE-smith names)."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "patch": self.patch,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "image_name": self.image_name,
            "problem_statement": self.problem_statement,
        }


def read(path: str | Path) -> list[Mapping[str, Any]]:
    """Raw rows of a ``.parquet`` or ``.jsonl`` file, in file order."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:  # pyarrow errors subclass these
            raise DatasetError(f"{path}: cannot read Parquet: {exc}") from None
    if path.suffix == ".jsonl":
        return list(_read_jsonl(path))
    raise DatasetError(f"{path}: rows must be a .parquet or .jsonl file")


def _read_jsonl(path: Path) -> Iterator[Mapping[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"{path}:{lineno}: not JSON: {exc}") from None


def validate(raw: Any, index: int) -> Row:
    """One checked Row from a raw mapping, or DatasetError naming the field."""
    where = f"row {index}"
    if not isinstance(raw, Mapping):
        raise DatasetError(f"{where}: expected an object, got {type(raw).__name__}")
    if isinstance(raw.get("instance_id"), str):
        where = f"row {index} ({raw['instance_id']!r})"
    missing = [name for name in REQUIRED if name not in raw]
    if missing:
        raise DatasetError(f"{where}: missing field {missing[0]}", row=index, field=missing[0])
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise DatasetError(f"{where}: unknown field {unknown[0]}", row=index, field=unknown[0])

    def bad(field: str, why: str) -> DatasetError:
        return DatasetError(f"{where}: field {field}: {why}", row=index, field=field)

    instance_id = _text(raw, "instance_id", bad)
    check_instance_id(instance_id, lambda why: bad("instance_id", why))
    repo = _text(raw, "repo", bad)
    if not _REPO_RE.match(repo) or repo.rsplit("/", 1)[-1] in (".", ".."):
        raise bad("repo", f"{repo!r} is not 'owner/name'")
    patch = _text(raw, "patch", bad)
    check_patch(patch, lambda why: bad("patch", why))
    f2p = _tests(raw, "FAIL_TO_PASS", bad)
    if not f2p:
        raise bad("FAIL_TO_PASS", "must name at least one test")
    p2p = _tests(raw, "PASS_TO_PASS", bad)
    both = set(f2p) & set(p2p)
    if both:
        raise bad("PASS_TO_PASS", f"test {sorted(both)[0]!r} is also in FAIL_TO_PASS")
    image_name = _text(raw, "image_name", bad)
    if any(c.isspace() for c in image_name):
        raise bad("image_name", "must not contain whitespace")
    statement = _text(raw, "problem_statement", bad)
    return Row(instance_id, repo, patch, f2p, p2p, image_name, statement)


def check_instance_id(value: str, fail) -> None:
    """An instance_id is used verbatim as a branch name and a file name."""
    if len(value) > _ID_MAX:
        raise fail(f"longer than {_ID_MAX} characters")
    if _REF_BAD.search(value) or "/" in value:
        raise fail(f"{value!r} is not usable as a git branch name")
    if (
        value.startswith(("-", "."))
        or value.endswith((".", ".lock"))
        or ".." in value
        or "@{" in value
        or value == "@"
    ):
        raise fail(f"{value!r} is not usable as a git branch name")


def check_patch(patch: str, fail) -> None:
    if not patch.startswith("diff --git "):
        raise fail("is not a git diff (must start with 'diff --git')")
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch)
    except UnidiffParseError as exc:
        raise fail(f"is not a parseable diff: {exc}") from None
    if not len(files):
        raise fail("changes no file")
    for changed in files:
        for name in (changed.source_file, changed.target_file):
            rel = name.split("/", 1)[-1] if name != "/dev/null" else ""
            if rel.startswith("/") or ".." in rel.split("/"):
                raise fail(f"touches a path outside the repository: {name!r}")


def _text(raw: Mapping[str, Any], field: str, bad) -> str:
    value = raw[field]
    if not isinstance(value, str) or not value.strip():
        raise bad(field, "must be a non-empty string")
    return value


def _tests(raw: Mapping[str, Any], field: str, bad) -> tuple[str, ...]:
    value = raw[field]
    if isinstance(value, str):
        # SWE-bench style: the list is stored as a JSON string.
        try:
            value = json.loads(value)
        except ValueError:
            raise bad(field, "is a string but not a JSON list") from None
    if hasattr(value, "tolist"):  # numpy arrays from some Parquet readers
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise bad(field, "must be a list of test names")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name.strip() or "\n" in name:
            raise bad(field, f"item {i} must be a non-empty one-line string")
        if name in seen:
            raise bad(field, f"test {name!r} appears twice")
        seen.add(name)
    return tuple(value)
