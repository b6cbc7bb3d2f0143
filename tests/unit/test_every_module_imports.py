"""Every module the project ships imports on the interpreter that runs the
suite (the seed's 3.12 tier runs this module too: packaging/run-tests.sh),
so a syntax or stdlib change of a newer Python shows in seconds, not in a
service that fails to start.

``__main__`` modules are entry points (importing one runs it): compiled only.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: package -> its directory (the trainer client is a distribution of its own)
PACKAGES = {"camg": ROOT / "camg", "environments": ROOT / "environments", "helper": ROOT / "helper",
            "tools": ROOT / "tools", "devtools": ROOT / "devtools", "camg_client": ROOT / "clients" / "python" / "camg_client"}


def _modules() -> list[str]:
    names = []
    for package, where in PACKAGES.items():
        names.append(package)
        for info in pkgutil.walk_packages([str(where)], prefix=package + "."):
            names.append(info.name)
    return sorted(names)


def test_the_walk_finds_the_project():
    names = _modules()
    assert {"camg.serve", "helper.verbs", "environments.coding.log_evaluation", "devtools.canary_table",
            "camg_client.rollout"} <= set(names)


@pytest.mark.parametrize("name", _modules())
def test_module_imports(name):
    if name.endswith(".__main__"):
        spec = importlib.util.find_spec(name)
        compile(Path(spec.origin).read_text(), spec.origin, "exec")
        return
    importlib.import_module(name)
