"""A real Prometheus server scrapes a real Coding ``camg.serve`` and the root
helper's own metrics endpoint (helper.json metrics_port, a loopback port of
its own) every second while gold and no-op episodes run on the demo task
set; the counts per outcome, the latency histograms and the helper's verbs,
live sandboxes, probe state and sweep are read back through Prometheus'
query API (/api/v1/query).

The counter environment and Shop: tests/unit/test_prometheus.py. Runs in
one test, so the leak check sees the helper, the service and Prometheus gone.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import conftest as pc
from camg.config import task_manifest as manifest
from camg_client import Client
from tests.support.services import ServiceProcess, clean_git_tree, free_port
from devtools.harness.prometheus import PrometheusServer
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CACHE = pc.CACHE / "coding"
CREATE, EXEC = "io.camg.helper.CreateSandbox", "io.camg.helper.Exec"


def prepare(demo_set, demo_image, work: Path) -> dict:
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    images = work / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    out = work / "manifest.json"
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=out, layers_root=CACHE / "layers")
    return {"manifest": out, "images": images, "mirrors": demo_set / "mirrors"}


def configure_coding(prepared: dict, helper_socket: str, tmp: Path) -> Path:
    from camg.configure import configure
    lock = tmp / "requirements.lock"
    lock.write_text("swebench==4.1.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": helper_socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(prepared["manifest"]), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(prepared["mirrors"]),
                         "images": str(prepared["images"]),
                         "layers_root": str(CACHE / "layers")}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared",
              source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "coding.json"


def test_coding_and_the_helper_through_prometheus(demo_set, demo_image, rootfs, tmp_path):
    from tools import oci_demo as demo
    prepared = prepare(demo_set, demo_image, tmp_path)
    base = Path(tempfile.mkdtemp(prefix="camg-prom-helper-"))
    base.chmod(0o711)
    metrics_port = free_port()
    cfg = pc.helper_config(base, demo.cache_root_from_env(), rootfs, metrics_port=metrics_port,
                           lower_roots=[str(demo.cache_root_from_env()), str(CACHE / "layers"),
                                        str(pc.CACHE / "helper")])
    helper = pc.start_helper(base, cfg)
    service = prom = None
    try:
        service = ServiceProcess(configure_coding(prepared, helper.socket, tmp_path))
        service.wait_ready(timeout=120)
        prom = PrometheusServer(tmp_path / "prom", {
            "coding": service.url.removeprefix("http://"),
            "helper": f"127.0.0.1:{metrics_port}"}).start()
        prom.wait_up()
        assert prom.value("camg_helper_probes_ok") == 1
        assert prom.value("camg_helper_sweeps_total") == 1
        assert prom.value('camg_helper_up{environment="coding"}') == 1

        client = Client(service.url, timeout=600)
        task = manifest.load(prepared["manifest"]).tasks[1]
        gold = client.create(task_id=task.task_id)["episode_id"]
        step = client.step(gold, {"operation": "shell", "command":
                                  f"git apply -R - <<'CAMG_EOF'\n{task.data['patch']}\nCAMG_EOF"})
        assert step["observation"]["exit_code"] == 0
        assert client.step(gold, {"operation": "finish"})["reward"] == 1.0
        noop = client.create(task_id=task.task_id)["episode_id"]
        done = client.step(noop, {"operation": "finish"})
        assert done["reward"] == 0.0 and done.get("failure_class") is None, done
        client.close(client.create(task_id=task.task_id)["episode_id"])

        prom.wait_for('sum by (outcome) (camg_episodes_ended_total{environment="coding"})',
                      lambda got: got == {"done": 2, "closed": 1}, by="outcome")
        env = '{environment="coding"}'
        assert prom.value(f'sum(camg_episodes_ended_total{{environment="coding",'
                          f'failure_class!="none"}})') is None
        assert prom.value(f"sum(camg_episodes_started_total{env})") == 3
        assert prom.value(f"camg_reset_seconds_count{env}") == 3
        assert prom.value(f"camg_step_seconds_count{env}") == 3
        assert prom.value(f"camg_grade_seconds_count{env}") == 2
        prom.assert_plausible_histogram("camg_reset_seconds", 'environment="coding"', 3,
                                        upper_s=120)
        prom.assert_plausible_histogram("camg_grade_seconds", 'environment="coding"', 2,
                                        upper_s=600)
        assert prom.value(f"camg_episodes_live{env}") == 0

        # The helper: every sandbox of the three episodes (and their graders)
        # made and gone, its verbs counted by name, Exec's latency histogram.
        prom.wait_for("camg_helper_sandboxes_live", lambda v: v == 0)
        made = prom.value(f'camg_helper_requests_total{{verb="{CREATE}",error="none"}}')
        assert made >= 3, made
        assert prom.value('sum(camg_helper_requests_total{verb="unknown"})') is None
        execs = prom.value(f'camg_helper_request_seconds_count{{verb="{EXEC}"}}')
        assert execs >= 1
        prom.assert_plausible_histogram("camg_helper_request_seconds", f'verb="{EXEC}"', execs,
                                        upper_s=600)
        assert prom.value("camg_helper_containers_live") == 0
    finally:
        if prom is not None:
            prom.stop()
        if service is not None:
            assert service.stop() == 0, service.output()[-3000:]
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)
