"""The operator's end-to-end check on General: ``python -m camg_client
--policy oracle`` against a real service (references enabled, the tasks
prepared with ``--references``) earns the maximum, 1.0, on one
opensource-code task (the gold patch applied by shell, then the MiMo
verifier) and one general_agent task (its reference actions and answer,
rule items checked in the container, LLM items by a local judge);
``--policy noop`` (finish at once) earns the minimum, 0.0, on both.

The local judge stands in for the LLM: it passes an item iff every part of
the item's pass anchor appears in the evidence (the answer), so the
maximum means every rule item and every judged item passed. Kept cheap:
one code task (the demo's first) instead of three.
"""

from __future__ import annotations

import json
import sys

import pytest

from general_fixtures import KEY, demo_for, helper_for
from test_oracle_autoresearch import run_rollout
from tests.support.fake_judge import FakeJudge
from tools.judge_stub import anchor_verdict
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


@pytest.fixture(scope="module")
def oracle_demo(demo_set):
    """The General demo with one code task (the session's general_demo has three)."""
    with demo_for(demo_set, code_count=1) as built:
        yield built


@pytest.fixture(scope="module")
def oracle_helper(oracle_demo, lower_root, rootfs):
    with helper_for(oracle_demo, lower_root, rootfs) as helper:
        yield helper


@pytest.fixture(scope="module")
def oracle_service(oracle_demo, oracle_helper, tmp_path_factory):
    from camg.configure import configure
    from environments.general.prepare import prepare_general
    from tests.support.services import ServiceProcess, clean_git_tree, free_port

    tmp = tmp_path_factory.mktemp("general-oracle")
    prepare_general(code_rows=str(oracle_demo["code_rows"]),
                    general_rows=str(oracle_demo["general_rows"]), envs=str(oracle_demo["envs"]),
                    images=str(oracle_demo["images"]), output_dir=tmp / "data",
                    references=str(oracle_demo["out"]))
    (tmp / "requirements.lock").write_text("openai==3.57.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(tmp / "requirements.lock"), "state_root": str(tmp / "state"),
        "helper_socket": oracle_helper.socket, "executables": {"python": sys.executable},
        "environments": {"general": {
            "manifest": str(tmp / "data" / "manifest.json"), "port": free_port(), "capacity": 8,
            "references": True,
            "limits": {"reset_timeout_s": 400.0, "action_timeout_s": 300.0, "grade_timeout_s": 300.0},
            "settings": {"pool_size": 0, "cpu": 0.5, "memory_bytes": 1 << 30, "pids_max": 256,
                         "connect_timeout_s": 300.0, "judge_timeout_s": 10.0,
                         "judge_attempts": 2, "judge_backoff_s": 0.05}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    body = json.loads((tmp / "data" / "manifest.json").read_text())
    tasks = {kind: [t["task_id"] for t in body["tasks"] if t["data"]["kind"] == kind]
             for kind in ("opensource-code", "general_agent")}
    with FakeJudge(responder=anchor_verdict) as judge:
        service = ServiceProcess(tmp / "prepared" / "general.json", env={
            "GA_JUDGE_URL": judge.url, "GA_JUDGE_MODEL": "anchor-judge", "GA_JUDGE_KEY": KEY,
            "GA_JUDGE_API": "chat"})
        try:
            service.wait_ready(timeout=300)
            yield {"service": service, "routes": tmp / "prepared" / "routes.json",
                   "tasks": tasks, "judge": judge, "tmp": tmp}
        finally:
            assert service.stop() == 0, service.output()[-3000:]
            from camg.sandboxes.containers import ContainerClient
            left = ContainerClient(oracle_helper.socket, owner="general").list()
            assert left == [], f"containers left after the service stopped: {left}"


def test_every_prepared_task_carries_its_reference(oracle_service):
    body = json.loads((oracle_service["tmp"] / "data" / "manifest.json").read_text())
    kinds = {t["task_id"]: frozenset(t["data"]["reference"]) for t in body["tasks"]}
    assert set(kinds.values()) == {frozenset({"patch"}), frozenset({"actions"})}, kinds


def test_oracle_earns_one_and_noop_zero_through_camg_rollout(oracle_service, tmp_path):
    chosen = [oracle_service["tasks"]["opensource-code"][0],
              oracle_service["tasks"]["general_agent"][-1]]
    status, lines = run_rollout(oracle_service["routes"], "general", "oracle", chosen, tmp_path)
    assert status == 0, lines
    assert sorted((l["task_id"], l["reward"], l["failure_class"]) for l in lines) == \
        sorted((t, 1.0, None) for t in chosen), lines
    judged = [o for o in oracle_service["service"].outcomes()
              if o.get("task_kind") == "general_agent" and o.get("judge")]
    assert judged and all(j["judge_score"] == 1.0 for o in judged for j in o["judge"]), judged
    status, lines = run_rollout(oracle_service["routes"], "general", "noop", chosen, tmp_path)
    assert status == 0, lines
    assert sorted((l["task_id"], l["reward"], l["failure_class"], l["steps"]) for l in lines) == \
        sorted((t, 0.0, None, 1) for t in chosen), lines
