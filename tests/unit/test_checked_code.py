"""The shipped Python is checked: ruff (lint and format) and mypy report
nothing over camg/, helper/, environments/ and the client, at the settings of
pyproject.toml. The checkers come from requirements/lint.txt, in a venv of
their own under $CAMG_CACHE (built once, never the services' venv); mypy
reads the installed packages of the interpreter running the tests, so the
services' own libraries are what it checks against."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.framework_venvs import pinned_venv
from tests.support.services import REPO

CODES = re.compile(r"^(\[[\w, -]*\]|:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?")
CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
CHECKED = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]


def _pins() -> list[str]:
    lines = (REPO / "requirements" / "lint.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def checkers() -> Path:
    return pinned_venv(CACHE / "tool-venvs", "lint", _pins())


def _run(python: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUFF_CACHE_DIR": str(tmp / "ruff-cache")}
    return subprocess.run([str(python), "-m", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


def test_ruff_lint_finds_nothing(checkers, tmp_path):
    proc = _run(checkers, "ruff", "check", "--no-fix", *CHECKED, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]


def test_ruff_format_changes_nothing(checkers, tmp_path):
    proc = _run(checkers, "ruff", "format", "--check", "--diff", *CHECKED, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing(checkers, tmp_path):
    # the cache in tmp_path: concurrent tiers (3.11 and 3.12) never share one
    proc = _run(checkers, "mypy", "--python-executable", sys.executable,
                "--cache-dir", str(tmp_path / "mypy-cache"), tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout, proc.stdout


def test_every_kept_suppression_says_why():
    """A `noqa` or `type: ignore` left in checked code carries its reason
    after it on the same line."""
    bare = []
    for top in CHECKED:
        for path in sorted((REPO / top).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for marker in ("# noqa", "# type: ignore"):
                    at = line.find(marker)
                    if at < 0:
                        continue
                    # the codes, then the reason: "# noqa: E501  # why", "# noqa: F401 (why)",
                    # "# type: ignore[x]  # why"
                    reason = CODES.sub("", line[at + len(marker):]).strip(" #-\t")
                    if not reason:
                        bare.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert bare == [], "suppressions without a reason:\n" + "\n".join(bare)
