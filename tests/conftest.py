"""Shared fixtures of the whole suite (privileged/ and system/ add their own)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

from tests.support.budget import FULL
from devtools.harness.auth import session_token, trainers_file
from tests.support.services import ServiceProcess, configure_counter


_RUN_TMP = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """This run's own temporaries (tempfile in this process: every helper's
    base, hence every sandbox mount; the fixtures' work dirs) under
    /tmp/camg-<pid>-<random>/. The privileged leak check leaves alone what is tagged
    with another live run's pid (tests/privileged/conftest.py), so runs side
    by side (packaging/run-tests.sh's lanes, engineers on one machine) do
    not report each other's mounts. pytest's tmp_path root is fixed first
    and stays where it was (its retention of the last runs works there)."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        factory.getbasetemp()
    # mkdtemp, not a fixed camg-<pid>: run-tests.sh runs unit tiers side by
    # side, each in a PID namespace of its own where pytest is pid 2, and a
    # shared /tmp/camg-2 was removed by whichever run ended first.
    root = Path(tempfile.mkdtemp(prefix=f"camg-{os.getpid()}-", dir=tempfile.gettempdir()))
    root.chmod(0o1777)  # like /tmp: helpers and services of other uids write here too
    tempfile.tempdir = str(root)
    config.stash[_RUN_TMP] = str(root)
    # The session's trainer token (devtools/harness/auth.py): every service the
    # suite starts runs with authentication on.
    session_token()


def pytest_unconfigure(config):
    root = tempfile.tempdir
    if root and root == config.stash.get(_RUN_TMP, None):
        Path(trainers_file()).unlink(missing_ok=True)
        tempfile.tempdir = None
        try:
            os.rmdir(root)  # only when empty: never a tree walk over what may be mounted
        except OSError:
            pass


def pytest_collection_modifyitems(config, items):
    """Tests marked ``full`` run only with CAMG_FULL=1 (tests/support/budget.py)."""
    if FULL:
        return
    left_out = [item for item in items if item.get_closest_marker("full")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("full")]
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"left out (marked full; CAMG_FULL=1 runs them): "
                                f"{', '.join(item.nodeid for item in left_out)}")


@pytest.fixture(scope="session")
def cache_root() -> Path:
    """Where expensive builds (rootfs, images, indexes) are cached between runs."""
    root = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _service_starter(tmp_path: Path, started: list):
    def start(*, env: dict | None = None, wait: bool = True, **options) -> ServiceProcess:
        service = ServiceProcess(configure_counter(tmp_path / f"svc{len(started)}", **options), env)
        started.append(service)
        return service.wait_ready() if wait else service
    return start


def _stop_all(started: list) -> None:
    for service in started:
        # SIGINT is gunicorn's quick stop: tests that check the graceful
        # path stop their service with SIGTERM themselves.
        service.stop(signal.SIGINT)


@pytest.fixture
def counter_service(tmp_path):
    """Start real camg.serve processes running the framework's test environment."""
    started: list = []
    yield _service_starter(tmp_path, started)
    _stop_all(started)


@pytest.fixture(scope="module")
def shared_counter_service(tmp_path_factory):
    """One counter service for a whole module (tests must not rely on its state)."""
    started: list = []
    yield _service_starter(tmp_path_factory.mktemp("shared"), started)(
        limits={"action_timeout_s": 2, "grade_timeout_s": 5}, capacity=64)
    _stop_all(started)
