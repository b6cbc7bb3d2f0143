"""Fixtures of the General acceptance tests: the demo set's images published
to a loopback registry, the agent environment, a helper mediating Docker with
both, the prepared manifest, a fake judge and a running General service.

Session-scoped and imported into conftest.py (like coding_fixtures.py), so
the General modules share one of each instead of building them per module
(~80 s each). A module imports only the plain helpers below (tasks_of,
configure_general, judge_env, KEY); importing a fixture name would give that
module a copy of its own. A test that changes the shared judge's reply sets
it back (``finally``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import conftest as pc
from tests.support import container_image as ci
from tests.support.fake_judge import FakeJudge, Reply
from tools.loopback_registry import LocalRegistry
from devtools.harness.auth import deployment_auth

KEY = "sk-general-test-key-0001"


@contextlib.contextmanager
def demo_for(demo_set: Path, **options):
    """General's demo set (``environments.general.demo.assemble.build`` options) published to
    a loopback registry of its own, with the agent environment."""
    from environments.general.build import agent_env
    from environments.general.demo import assemble as demo

    base = Path(tempfile.mkdtemp(prefix="camg-general-demo-"))
    registry = LocalRegistry(base / "registry").start()
    pc.allow_process(registry.pid)
    built: dict = {}
    try:
        built = demo.build(pc.CACHE, demo_set, registry.address, base / "demo", **options)
        built["agent_env"] = agent_env.cached(pc.CACHE)
        yield built
    finally:
        api = ci.docker_api()
        for ref in built.get("refs", []):
            ci.remove_image(api, ref)
        api.close()
        registry.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def general_demo(demo_set):
    with demo_for(demo_set) as built:
        yield built


@contextlib.contextmanager
def helper_for(demo: dict, lower_root: Path, rootfs: Path):
    """A helper mediating Docker with ``demo``'s images and agent environment."""
    base = Path(tempfile.mkdtemp(prefix="camg-general-helper-"))
    base.chmod(0o711)
    manifest = ci.write_manifest(base / "images.json", demo["refs"])
    containers = ci.containers_config(
        manifest, ci.scope_for("general"), agent_env_source=str(demo["agent_env"]),
        max_cpu=2.0, max_memory_bytes=2 << 30, max_pids=1024, containers_per_peer=96,
        containers_total=128)
    helper = pc.start_helper(base, pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                                                    containers=containers), wait_probes=False)
    try:
        yield helper
    finally:
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def general_helper(general_demo, lower_root, rootfs):
    with helper_for(general_demo, lower_root, rootfs) as helper:
        yield helper


@pytest.fixture(scope="session")
def general_prepared(general_demo, tmp_path_factory):
    from environments.general.prepare import prepare_general

    out = tmp_path_factory.mktemp("general-prepared")
    prepare_general(code_rows=str(general_demo["code_rows"]),
                    general_rows=str(general_demo["general_rows"]), envs=str(general_demo["envs"]),
                    images=str(general_demo["images"]), output_dir=out)
    return out


@pytest.fixture(scope="session")
def fake_judge():
    with FakeJudge(default=Reply(text='{"score": 1, "reason": "ok"}')) as judge:
        yield judge


def judge_env(judge: FakeJudge) -> dict:
    return {"GA_JUDGE_URL": judge.url, "GA_JUDGE_MODEL": "fake-judge-1", "GA_JUDGE_KEY": KEY,
            "GA_JUDGE_API": "chat"}


def configure_general(tmp: Path, prepared: Path, helper, *, capacity: int = 40, **settings) -> Path:
    from camg.configure import configure
    from tests.support.services import clean_git_tree, free_port

    lock = tmp / "requirements.lock"
    lock.write_text("openai==3.57.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": helper.socket, "executables": {"python": sys.executable},
        "environments": {"general": {
            "manifest": str(prepared / "manifest.json"), "port": free_port(), "capacity": capacity,
            "limits": {"reset_timeout_s": 400.0, "action_timeout_s": 300.0, "grade_timeout_s": 300.0},
            "settings": {"pool_size": 0, "cpu": 0.5, "memory_bytes": 1 << 30, "pids_max": 256,
                         "connect_timeout_s": 300.0,
                         "judge_timeout_s": 2.0, "judge_attempts": 2, "judge_backoff_s": 0.05,
                         **settings}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "general.json"


@pytest.fixture(scope="session")
def general_service(general_prepared, general_helper, fake_judge, tmp_path_factory):
    from tests.support.services import ServiceProcess

    tmp = tmp_path_factory.mktemp("general-service")
    service = ServiceProcess(configure_general(tmp, general_prepared, general_helper),
                             env=judge_env(fake_judge))
    try:
        service.wait_ready(timeout=300)
        yield service
    finally:
        code = service.stop()
        assert code == 0, service.output()[-3000:]
        from camg.sandboxes.containers import ContainerClient
        left = ContainerClient(general_helper.socket, owner="general").list()
        assert left == [], f"containers left after the service stopped: {left}"


def tasks_of(prepared: Path, kind: str) -> list[dict]:
    body = json.loads((prepared / "manifest.json").read_text())
    return [t for t in body["tasks"] if t["data"]["kind"] == kind]


__all__ = ["general_demo", "general_helper", "general_prepared", "fake_judge", "general_service",
           "demo_for", "helper_for", "judge_env", "configure_general", "tasks_of", "KEY", "os"]
