"""Scratch venvs holding one RL framework's stock PyPI release, for the
adapter tests: never the services' venv, never the lock.

A venv is made from the pins of one extra of the client distribution
(clients/python/pyproject.toml, the one place they are written), keyed by
those pins and the interpreter, under ``$CAMG_CACHE/adapter-venvs/``: the
first run builds it (verifiers 0.4.0 ~2.5 min, skyrl-gym 0.4.0 ~1 min here),
later runs reuse it. The build goes to a temporary directory renamed into
place, under an flock, so concurrent test processes (the split unit tier)
build it once and never see half a venv. As test_client_distribution does,
the venv is made without pip and the services' pip installs into it
(``--python``). camg_client itself is not installed there: the loops run
with clients/python on PYTHONPATH, so the venv outlives client changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from collections.abc import Sequence
from pathlib import Path

from tests.support.services import REPO

CLIENT_PYPROJECT = REPO / "clients" / "python" / "pyproject.toml"


def extra_pins(extra: str) -> list[str]:
    project = tomllib.loads(CLIENT_PYPROJECT.read_text())["project"]
    return list(project["optional-dependencies"][extra])


def framework_venv(cache: Path, extra: str, no_deps: tuple[str, ...] = ()) -> Path:
    """The venv holding ``extra``'s pins (built once); returns its python.
    The pins of the projects named in ``no_deps`` go in without their own
    requirements (a distribution whose metadata pulls far more than the part
    a test runs imports: the extra then lists what that part needs)."""
    pins = extra_pins(extra)
    bare = [p for p in pins if re.split(r"[=<>!~\[; ]", p, maxsplit=1)[0] in no_deps]
    return pinned_venv(cache / "adapter-venvs", extra, pins, bare)


def pinned_venv(root: Path, name: str, pins: list[str], bare: Sequence[str] = ()) -> Path:
    """The venv ``root/name-KEY`` holding ``pins`` (``bare`` among them
    installed without their requirements), keyed by the pins and the
    interpreter, built once; returns its python."""
    bare = list(bare)  # (a list, as the key always hashed it)
    # bare joins the key only when set: the other extras' cached venvs keep theirs
    key = hashlib.sha256(json.dumps([sys.version, pins, *([bare] if bare else [])])
                         .encode()).hexdigest()[:12]
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{key}"
    python = target / "bin" / "python"
    with open(root / f".{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return python
        building = root / f".{name}-{key}.building"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        # symlinks: a copied interpreter would look for its libpython beside the copy
        venv.create(building, with_pip=False, symlinks=True)
        for group, flags in (([p for p in pins if p not in bare], []), (bare, ["--no-deps"])):
            if not group:
                continue
            proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                                   "--no-input", "--python", str(building / "bin" / "python"),
                                   "install", "-q", *flags, *group], capture_output=True,
                                  text=True, timeout=1800)
            if proc.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                raise RuntimeError(f"installing {group} failed:\n{proc.stderr[-4000:]}")
        (building / ".complete").write_text(json.dumps(pins) + "\n")
        # venv wrote absolute paths of the building directory into its scripts
        # and pyvenv.cfg; the loops run the interpreter directly, which is
        # location-independent, but uv (verifiers' harness) is run from bin/.
        building.rename(target)
    return python
