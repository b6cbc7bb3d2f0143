"""The Coding demo's fixtures, shared by every module that needs them (Coding,
its integrity sandboxes, regrade, the swesmith image, General's code tasks):
session-scoped and imported into conftest.py, so the helper starts and the
task set is found once per run, not once per module. A module must not
import these names itself: a module-level copy would be a fixture of its own
and build everything again.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

import conftest as pc

CACHE = pc.CACHE / "coding"


@pytest.fixture(scope="session")
def demo_image():
    from tools import oci_demo as demo
    return demo.ensure_demo_image(demo.cache_root_from_env())


@pytest.fixture(scope="session")
def coding_helper(demo_image, rootfs):
    from tools import oci_demo as demo
    layers_root = CACHE / "layers"
    layers_root.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="camg-coding-test-"))
    base.chmod(0o711)
    cfg = pc.helper_config(base, demo.cache_root_from_env(), rootfs,
                           lower_roots=[str(demo.cache_root_from_env()), str(layers_root),
                                        str(pc.CACHE / "helper")])
    helper = pc.start_helper(base, cfg)
    pc.state_root(base / "state" / "ledger")
    pc.state_root(base / "uppers")
    yield helper
    pc.stop_helper(helper)
    shutil.rmtree(base)


@pytest.fixture(scope="session")
def demo_set(demo_image, coding_helper):
    """The demo task set, FAIL_TO_PASS/PASS_TO_PASS found in sandboxes (cached)."""
    from environments.coding.demo.demo_tasks import fetch_sdist
    from environments.coding.demo.sandbox_runner import ensure_demo_set
    return ensure_demo_set(CACHE, demo_image.image, coding_helper.socket, fetch_sdist(CACHE / "sdist"))


__all__ = ["demo_image", "coding_helper", "demo_set"]
