"""Shared fixtures of the whole suite (privileged/ and system/ add their own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.services import ServiceProcess, configure_counter


@pytest.fixture(scope="session")
def cache_root() -> Path:
    """Where expensive builds (rootfs, images, indexes) are cached between runs."""
    root = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture
def counter_service(tmp_path):
    """A real camg.serve process running the framework's test environment."""
    started = []

    def start(*, env: dict | None = None, wait: bool = True, **options) -> ServiceProcess:
        service = ServiceProcess(configure_counter(tmp_path / f"svc{len(started)}", **options), env)
        started.append(service)
        return service.wait_ready() if wait else service

    yield start
    for service in started:
        service.stop()
