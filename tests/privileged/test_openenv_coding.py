"""The stock openenv-core client (GenericEnvClient over /ws) runs a whole
Coding episode on a real `python -m camg.serve` Coding service with a real
helper: reset, a shell step that applies the gold fix, finish -> 1.0.
The fixtures are the Coding acceptance module's (same cached demo set)."""

from __future__ import annotations

import json
import sys

import pytest

from camg import task_manifest as manifest
from test_coding_episodes import CACHE, coding_helper, demo_image, demo_set, prepared  # noqa: F401

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def test_stock_openenv_client_runs_a_whole_coding_episode(prepared, coding_helper,  # noqa: F811
                                                          tmp_path):
    from openenv.core import GenericEnvClient

    from camg.configure import configure
    from tests.support.services import ServiceProcess, clean_git_tree, free_port

    lock = tmp_path / "requirements.lock"
    lock.write_text("swebench==4.1.0\n")
    deployment = {
        "runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
        "helper_socket": coding_helper.socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(prepared["manifest"]), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(prepared["mirrors"]),
                         "images": str(prepared["images"]),
                         "layers_root": str(CACHE / "layers")}}},
    }
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp_path / "deployment.json", tmp_path / "prepared",
              source_tree=clean_git_tree(tmp_path / "src"))
    service = ServiceProcess(tmp_path / "prepared" / "coding.json")
    try:
        service.wait_ready(timeout=120)
        task = manifest.load(prepared["manifest"]).tasks[1]
        patch = task.data["patch"]
        with GenericEnvClient(base_url=service.url, message_timeout_s=600).sync() as env:
            result = env.reset(task_id=task.task_id)
            assert result.done is False
            assert task.data["problem_statement"] in result.observation["output"]
            result = env.step({"operation": "shell",
                               "command": f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"})
            assert result.observation["exit_code"] == 0 and result.done is False
            state = env.state()
            assert state["task_id"] == task.task_id and state["step_count"] == 1
            result = env.step({"operation": "finish"})
            assert result.done is True and result.reward == 1.0, result
            eid = env.state()["episode_id"]
        assert [(o["episode_id"], o["reward"]) for o in service.outcomes()] == [(eid, 1.0)]
    finally:
        assert service.stop() == 0, service.output()[-3000:]
