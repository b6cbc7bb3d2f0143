"""The layering docs/architecture.md draws, as import-linter contracts (pyproject.toml).

The contracts hold on the tree; and each one fails, naming the offending
import, when a forbidden import is planted in a temporary copy (tests/ and
bench/ are copied too: the contracts that no shipped package and no
benchmark imports the tests name their modules).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("camg", "environments", "helper", "tools", "devtools")


def lint(tree: Path) -> subprocess.CompletedProcess:
    # The copy comes first on sys.path, before the editable install's finder.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import "
                           "lint_imports_command; sys.exit(lint_imports_command())",
                           "--config", str(tree / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_contracts_hold_on_the_tree():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def _python_only(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__"
            or (not n.endswith(".py") and not os.path.isdir(os.path.join(directory, n)))]


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    tree = tmp_path_factory.mktemp("layering")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.gz", "data", "testdata"))
    # The client's own distribution, at the top level of the copy as the
    # services' install maps it.
    shutil.copytree(ROOT / "clients" / "python" / "camg_client", tree / "camg_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The tests and the benchmarks, whose modules the last contracts name:
    # their Python files are all the graph needs.
    for package in ("tests", "bench"):
        shutil.copytree(ROOT / package, tree / package, ignore=_python_only)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


PLANTED = [
    # (file, line to add, what the report must name)
    ("camg/config/hashing.py", "from environments.coding import rows", "camg.config.hashing -> environments.coding.rows"),
    ("camg/config/task_manifest.py", "import tools.oci_demo", "camg.config.task_manifest -> tools.oci_demo"),
    ("helper/paths.py", "from camg import errors", "helper.paths -> camg.errors"),
    ("helper/ledger.py", "import camg.helper_client", "helper.ledger -> camg.helper_client"),
    ("camg/typed.py", "from camg.errors import ConfigError", "camg.typed -> camg.errors"),
    ("environments/coding/rows.py", "from environments.shop import goals", "environments.coding.rows -> environments.shop.goals"),
    ("environments/shop/pages.py", "from devtools.harness import shop", "environments.shop.pages -> devtools.harness.shop"),
    # the service reaches none of its own checks, demo or build code
    ("environments/shop/environment.py", "from environments.shop.checks import canaries",
     "environments.shop.environment -> environments.shop.checks.canaries"),
    ("camg_client/rollout.py", "from camg import errors", "camg_client.rollout -> camg.errors"),
    ("camg_client/client.py", "import environments.shop", "camg_client.client -> environments.shop"),
    # the services build nothing: no image tooling, no root-only task layers
    ("environments/coding/environment.py", "from environments.coding import prepare_layers",
     "environments.coding.environment -> environments.coding.prepare_layers"),
    # shipped code imports nothing of tests/ or bench/ (the harness lives in devtools/harness)
    ("devtools/reliability/rig.py", "from tests.support import services",
     "devtools.reliability.rig -> tests.support.services"),
    ("devtools/harness/helpers.py", "import bench.bench_helper", "devtools.harness.helpers -> bench.bench_helper"),
    # the test tiers (no __init__.py) are in the graph too
    ("camg/status.py", "from tests.privileged import conftest", "camg.status -> tests.privileged.conftest"),
    ("bench/bench_http.py", "from tests.support import services", "bench.bench_http -> tests.support.services"),
]


@pytest.mark.parametrize("path,line,named", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_violation_fails_naming_the_import(tree_copy, path, line, named):
    target = tree_copy / path
    original = target.read_text()
    target.write_text(original + f"\n{line}  # planted by test_layering\n")
    try:
        proc = lint(tree_copy)
    finally:
        target.write_text(original)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "BROKEN" in proc.stdout.upper()
    assert named in proc.stdout, proc.stdout[-3000:]
