"""Shared fixtures of the whole suite (privileged/ and system/ add their own)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.budget import FULL
from tests.support.services import ServiceProcess, configure_counter


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
