"""Small MiMo task roots for in-process transport tests (no container).

``code_task`` makes an opensource-code task (instance.json + workspace.tar)
whose repository has a one-line bug, hidden tests run with the host's
python3, and a gold fix; ``REPO_RUNTIME`` is put on sys.path so the tests
import the project's mimoagent without installing it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPO_RUNTIME = REPO / "third_party" / "mimo_runtime" / "mimoagent" / "src"
if str(REPO_RUNTIME) not in sys.path:
    sys.path.insert(0, str(REPO_RUNTIME))

CALC_BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
CALC_FIXED = CALC_BUGGY.replace("a - b", "a + b")
HIDDEN_TEST = ("import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n\n\n"
               "def test_mul():\n    assert calc.mul(2, 3) == 6\n")
GOLD = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def mul(a, b):\n")


def world_dir(prefix: str) -> Path:
    """A directory the agent uid can enter (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o755)
    return path


def code_task(root: Path, *, cwd: Path, test_command_lines: list[str] | None = None) -> dict:
    from environments.general.demo.code_tasks import build_instance

    source = root / "src-tree"
    source.mkdir(parents=True)
    (source / "calc.py").write_text(CALC_BUGGY)
    (source / "README").write_text("calc\n")
    test = "/usr/bin/python3 -B -c 'import sys; sys.path.insert(0, \".\"); import test_calc as t; t.test_add(); t.test_mul()'"
    instance = build_instance(root / "task", instance_id="calc-001", source=source, fix_patch=GOLD,
                              test_files={"test_calc.py": HIDDEN_TEST},
                              test_commands=test_command_lines or [test],
                              problem_statement="add() subtracts instead of adding.",
                              cwd=str(cwd), verifier_timeout_sec=60)
    return instance


def general_task(base: Path, which: int = 0) -> tuple[Path, list[dict], dict]:
    """A demo general_agent task rooted under ``base`` (root-only task dir) with
    its workspace, state and verifier output redirected under ``base``; returns
    (task root, oracle actions with the host's python, bind() path overrides)."""
    import json

    from environments.general.demo import agent_tasks

    roots = agent_tasks.build_all(base / "tasks")
    root = roots[which]
    instance = json.loads((root / "instance.json").read_text())
    instance["cwd"] = str(base / "workspace")
    (root / "instance.json").write_text(json.dumps(instance))
    oracle = json.loads((base / "tasks" / f"{root.name}.oracle.json").read_text())
    for action in oracle:
        if action["operation"] == "shell":
            action["command"] = action["command"].replace(agent_tasks.AGENT_PY, sys.executable)
    os.chmod(base / "tasks", 0o700)
    paths = {"state_root": str(base / "state"), "verifier_out": str(base / "verifier")}
    return root, oracle, paths
