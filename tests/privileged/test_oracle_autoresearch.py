"""The operator's end-to-end check on AutoResearch: ``python -m camg_client
--policy oracle`` against a real service (references enabled) earns the
maximum, 1.0, on every task it runs; ``--policy noop`` (submit at once, no
submission) the minimum, 0.0. Kept cheap: two small tabular tasks built on
the spot (not the whole demo set), the cached research image.

Also: the solution is never inside the sandbox before the oracle writes it
(the service reads it from the task package, which no sandbox mounts). The
403 where references are not enabled is tests/unit/test_rollout.py's.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import conftest as pc
from camg.configure import configure
from tests.support.services import ServiceProcess, clean_git_tree, free_port
from test_autoresearch_episodes import (  # noqa: F401  (module fixtures)
    GRADER_USER, ensure_grader_user, research_image, settings_for)
from test_autoresearch_service import check_clean
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

TASKS = ["diabetes", "breast-cancer"]


def run_rollout(routes: Path, env: str, policy: str, tasks: list[str], tmp: Path,
                concurrency: int = 2) -> tuple[int, list[dict]]:
    """``python -m camg_client`` (in-process main): exit status and its JSON lines."""
    from camg_client.cli import main

    ids, out = tmp / f"{policy}-ids.txt", tmp / f"{policy}.jsonl"
    ids.write_text("".join(t + "\n" for t in tasks))
    out.unlink(missing_ok=True)
    status = main(["--routes", str(routes), "--env", env, "--policy", policy,
                   "--episodes", str(len(tasks)), "--concurrency", str(concurrency),
                   "--tasks", str(ids), "--out", str(out), "--no-progress"])
    return status, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def small_roots(research_image):  # noqa: F811
    from camg.oci.images import write_materialized
    from environments.autoresearch.prepare import prepare
    from environments.autoresearch.demo import demo_tasks

    ensure_grader_user()
    base = Path(tempfile.mkdtemp(prefix="camg-ar-oracle-"))
    base.chmod(0o711)
    for name in TASKS:
        demo_tasks.build_task(name, base / "bundles")
    images = base / "materialized-images.json"
    write_materialized(images, (research_image.image,))
    roots = {"base": base, "packages": base / "packages", "workspaces": base / "workspaces",
             "private": base / "private", "images": images, "manifest": base / "manifest.json"}
    prepare(source=base / "bundles", packages_root=roots["packages"],
            workspaces_root=roots["workspaces"], private_root=roots["private"], images=images,
            image_name="camg/demo-autoresearch", output=roots["manifest"],
            grader_user=GRADER_USER, select=TASKS)
    yield roots
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def oracle_helper(small_roots, rootfs):
    from tools import oci_demo
    base = small_roots["base"] / "helper"
    cfg = pc.helper_config(base, small_roots["workspaces"], rootfs,
                           lower_roots=[str(oci_demo.cache_root_from_env()),
                                        str(small_roots["workspaces"]), str(pc.CACHE / "helper")],
                           private_roots=[str(small_roots["private"])])
    helper = pc.start_helper(base, cfg)
    pc.state_root(base / "state" / "ledger")
    pc.state_root(base / "uppers")
    yield helper
    pc.stop_helper(helper)


def configured(roots, helper, tmp: Path, references: bool = True) -> Path:
    lock = tmp / "requirements.lock"
    lock.write_text("numpy==2.4.6\nscikit-learn==1.9.1\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": helper.socket, "executables": {"python": sys.executable},
        "environments": {"autoresearch": {
            "manifest": str(roots["manifest"]), "port": free_port(), "capacity": 4,
            "references": references, "limits": {"action_timeout_s": 400, "idle_ttl_s": 600},
            "settings": settings_for(roots)}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    config = tmp / "prepared" / "autoresearch.json"
    done = check_clean(config)
    assert done.returncode == 0, done.stderr
    return config


def test_oracle_earns_one_and_noop_zero_through_camg_rollout(small_roots, oracle_helper,
                                                            tmp_path):
    from camg_client import Client

    svc = ServiceProcess(configured(small_roots, oracle_helper, tmp_path, True)).wait_ready(120)
    try:
        routes = tmp_path / "prepared" / "routes.json"
        status, lines = run_rollout(routes, "autoresearch", "oracle", TASKS, tmp_path)
        assert status == 0, lines
        assert [(l["task_id"], l["reward"], l["failure_class"]) for l in
                sorted(lines, key=lambda l: TASKS.index(l["task_id"]))] == \
            [(t, 1.0, None) for t in TASKS], lines
        assert all(l["steps"] == 3 for l in lines), lines   # write, run, submit
        status, lines = run_rollout(routes, "autoresearch", "noop", TASKS, tmp_path)
        assert status == 0 and sorted((l["task_id"], l["reward"]) for l in lines) == \
            sorted((t, 0.0) for t in TASKS), lines
        graded = [o for o in svc.outcomes() if o.get("reward") is not None]
        assert len(graded) == 2 * len(TASKS)
        # Before the oracle writes it, the solution is nowhere in the sandbox: /task
        # holds the public files only and the task package (solve.py) is not mounted.
        client = Client(svc.url, timeout=120)
        episode = client.create(task_id=TASKS[0])
        try:
            seen = client.step(episode["episode_id"], {
                "operation": "shell",
                "command": f"ls -A /task /workspace; ls {small_roots['packages']} 2>&1"})
            seen = seen["observation"]["output"]
            assert "solve.py" not in seen and "No such file" in seen, seen
        finally:
            client.close(episode["episode_id"])
    finally:
        assert svc.stop() == 0, svc.output()[-3000:]



def test_prometheus_counts_the_oracle_and_the_noop(small_roots, oracle_helper, tmp_path):
    """A real Prometheus (devtools/harness/prometheus.py) scrapes the service every
    second while camg_client's oracle and noop run one task each."""
    from devtools.harness.prometheus import PrometheusServer

    svc = ServiceProcess(configured(small_roots, oracle_helper, tmp_path, True)).wait_ready(120)
    env = 'environment="autoresearch"'
    try:
        with PrometheusServer(tmp_path / "prom",
                              {"autoresearch": svc.url.removeprefix("http://")}) as prom:
            prom.wait_up()
            routes = tmp_path / "prepared" / "routes.json"
            for policy, reward in (("oracle", 1.0), ("noop", 0.0)):
                status, lines = run_rollout(routes, "autoresearch", policy, TASKS[:1], tmp_path, 1)
                assert status == 0 and [l["reward"] for l in lines] == [reward], lines
            prom.wait_for(f"sum by (outcome) (camg_episodes_ended_total{{{env}}})",
                          lambda got: got == {"done": 2}, by="outcome")
            assert prom.value(f'sum(camg_episodes_ended_total{{{env},failure_class!="none"}})') \
                is None
            assert prom.value(f"sum(camg_episodes_started_total{{{env}}})") == 2
            assert prom.value(f"camg_step_seconds_count{{{env}}}") == 3 + 1  # write, run, submit; submit
            assert prom.value(f"camg_helper_up{{{env}}}") == 1
            prom.assert_plausible_histogram("camg_step_seconds", env, 4, upper_s=600)
            prom.assert_plausible_histogram("camg_reset_seconds", env, 2, upper_s=300)
    finally:
        assert svc.stop() == 0, svc.output()[-3000:]
