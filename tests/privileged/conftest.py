"""Privileged tests: root, real kernel features, and a leak check on every test.

Pytest glue only: what it calls lives in the shared harness (devtools/harness),
which the benchmarks and the reliability suites use too.

The autouse ``leak_check`` fixture snapshots, before each test, the mounts of
this mount namespace, the cgroup directories below every camg* cgroup parent,
this process's children and the entries of every registered state root
(devtools/harness/leaks.py), and fails the test if anything new is still there
afterwards (after a short settle). Session fixtures that own long-lived
things (a helper process, a docker daemon) register them with
``allow_process``/``allow_mounts_under`` so starting them inside a test is
not reported; directories they keep are reported only if registered with
``state_root`` and left non-empty.

Also here: the cached Debian rootfs (debootstrap, under $CAMG_CACHE) and a
session-wide camg-helper on its own socket, state dir and cgroup parents.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from devtools.harness import helpers
from devtools.harness.helpers import CACHE, ROOT, HelperProcess, remove_parents  # noqa: F401
from devtools.harness.leaks import WATCH
allow_process = WATCH.allow_process
allow_mounts_under = WATCH.allow_mounts_under
state_root = WATCH.state_root


def pytest_configure(config):
    config.addinivalue_line("markers", "leaks_allowed: skip the privileged leak check (explain why)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.privileged)


@pytest.fixture(scope="session", autouse=True)
def _require_root():
    if os.geteuid() != 0:
        pytest.skip("privileged tests need root (CI runs them as root)")


@pytest.fixture(autouse=True)
def leak_check(request):
    if request.node.get_closest_marker("leaks_allowed"):
        yield
        return
    before = WATCH.snapshot()
    yield
    leaks = WATCH.settled_leaks(before)
    if leaks:
        pytest.fail("left behind: " + "; ".join(leaks[:20]), pytrace=False)


# -- a real Debian rootfs -----------------------------------------------------

@pytest.fixture(scope="session")
def lower_root() -> Path:
    """The directory under which every helper test's lowers live."""
    path = CACHE / "helper"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def rootfs(lower_root: Path) -> Path:
    """debootstrap --variant=minbase bookworm, built once and cached."""
    return helpers.minbase(lower_root)


# -- a session helper ------------------------------------------------------------

def helper_config(base: Path, lower_root: Path, rootfs: Path, **extra) -> dict:
    return helpers.helper_config(base, [str(lower_root)], [str(rootfs)], name="test", **extra)


def start_helper(base: Path, cfg: dict, *, wait_probes: bool = True, args=()) -> HelperProcess:
    """A helper the leak check knows (its process and sandbox inits are not leaks)."""
    base.mkdir(parents=True, exist_ok=True)
    helper = HelperProcess(base, cfg)
    try:
        helper.launch(wait_probes=wait_probes, args=args, timeout=60)
    finally:
        if helper.proc is not None:
            allow_process(helper.proc.pid)
    return helper


def stop_helper(helper: HelperProcess) -> None:
    helper.stop(timeout=30)
    WATCH.forget_process(helper.proc.pid)


@pytest.fixture(scope="session")
def helper(lower_root, rootfs):
    # Not under pytest's basetemp: peer-credential tests connect as other
    # uids, so the socket's directories must be traversable (pytest keeps
    # its root 0700); the socket's own mode and group then decide.
    base = helpers.private_base("helper-test")
    cfg = helper_config(base, lower_root, rootfs)
    proc = start_helper(base, cfg)
    state_root(base / "state" / "ledger")
    state_root(base / "uppers")
    state_root(base / "state" / "mnt")
    yield proc
    stop_helper(proc)
    WATCH.forget_state_under(base)
    shutil.rmtree(base)


@pytest.fixture
def client(helper):
    c = helper.client(owner=f"t{os.getpid()}")
    yield c
    assert helper.proc.poll() is None, "the helper died during the test"
    # A test that forgot a sandbox fails; either way the next one starts clean.
    left = c.list_sandboxes()
    c.release_all()
    c.close()
    assert left == [], f"the test left sandboxes behind: {left}"


@pytest.fixture
def sandbox(client, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=256 << 20, cpu_quota=1.0, pids_max=256)
    yield sid
    client.destroy(sid)


# Session fixtures shared across modules (see each module's docstring): last,
# since they use the helpers above through ``import conftest``.
from coding_fixtures import coding_helper, demo_image, demo_set  # noqa: E402,F401
from general_fixtures import (fake_judge, general_demo, general_helper,  # noqa: E402,F401
                              general_prepared, general_service)
