"""The suite's own layout: pytest imports test modules by basename (no
packages under tests/), so two tiers' modules with one name stop the whole
collection ("import file mismatch"). It happened twice; this names them
before CI does."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_its_own_basename():
    seen = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "__pycache__" not in path.parts and path.name != "__init__.py":
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items()
               if len(paths) > 1 and name != "conftest.py"}
    assert not clashes, clashes
