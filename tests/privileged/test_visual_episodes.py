"""Visual end to end: the real service (python -m camg.serve) on the demo tasks, task
containers through the helper's container mediator (Docker), renders in renderer
sandboxes (headless Chromium), and the scripted image-statistics judge over HTTP.

Every test ends with the conftest's leak check; the service's own leftovers
(containers, sandboxes, browser processes, temporary directories) are checked
explicitly, including after ``kill -9`` of the service.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import conftest as pc
from camg.config import task_manifest as manifest
from camg.configure import configure
from camg.sandboxes.containers import ContainerClient
from camg_client import Client
from tests.privileged.container_fixtures import image_ref, needs_docker  # noqa: F401 (fixture)
from tests.support import container_image as ci
from tests.support.services import ServiceProcess, clean_git_tree, free_port
from tests.support.visual_judge import scripted_judge
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow, pytest.mark.docker, needs_docker]

OWNER = f"visual-t{os.getpid()}"


@pytest.fixture(scope="module")
def renderer_dir(lower_root):
    from environments.visual.build.renderer_rootfs import ensure_renderer_rootfs
    return ensure_renderer_rootfs(lower_root)


@pytest.fixture(scope="module")
def mirror_manifest():
    from environments.visual.build.cdn_mirror import build_mirror
    return build_mirror(pc.CACHE / "visual" / "cdn-mirror")


@pytest.fixture(scope="module")
def visual_helper(image_ref, lower_root, rootfs):  # noqa: F811
    base = Path(tempfile.mkdtemp(prefix="camg-visual-test-"))
    base.chmod(0o711)
    images = ci.write_manifest(base / "images.json", [image_ref])
    cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                           containers=ci.containers_config(
                               images, ci.scope_for("visual"), max_cpu=2.0,
                               max_memory_bytes=2 << 30, max_pids=2048, containers_per_peer=24))
    helper = pc.start_helper(base, cfg, wait_probes=False)
    pc.state_root(base / "state" / "ledger")
    ContainerClient(helper.socket, owner="pull").pull(image_ref)
    yield helper
    pc.stop_helper(helper)
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def judge():
    with scripted_judge() as j:
        yield j


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, image_ref, renderer_dir, mirror_manifest, visual_helper):  # noqa: F811
    from environments.visual.prepare import prepare_visual
    from environments.visual.demo import demo_tasks

    tmp = tmp_path_factory.mktemp("visual")
    rows = demo_tasks.build(tmp / "demo")
    prepare_visual(rows_path=rows, renderer=renderer_dir, cdn_mirror=mirror_manifest,
                   output=tmp / "visual-manifest.json", image=image_ref)
    lock = tmp / "requirements.lock"
    lock.write_text("falcon==4.4.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": visual_helper.socket, "executables": {"python": sys.executable},
        "environments": {"visual": {
            "manifest": "visual-manifest.json", "port": free_port(), "capacity": 8,
            "limits": {"action_timeout_s": 600, "grade_timeout_s": 120},
            "settings": {"memory_bytes": 256 << 20, "cpu": 0.5, "pids_max": 256, "pool_size": 1,
                         "render_timeout": 240, "render_memory_bytes": 1 << 30,
                         "judge_backoff_s": 0.0, "judge_attempts": 2, "helper_owner": OWNER}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    oracle = json.loads((tmp / "demo" / "oracle.json").read_text())
    return tmp / "prepared" / "visual.json", oracle


def judge_env(judge):
    return {"WD_JUDGE_URL": judge.url, "WD_JUDGE_MODEL": "fake-vision",
            "WD_JUDGE_KEY": "sk-visual-test"}


@pytest.fixture
def service(prepared, judge, visual_helper):
    svc = ServiceProcess(prepared[0], env=judge_env(judge)).wait_ready(120)
    yield svc
    svc.stop()
    assert_nothing_left(visual_helper, svc)


def browser_pids() -> list[int]:
    """Renderers in sandboxes of this run's helpers, whose cgroup parents
    carry this pytest's pid (devtools/harness/helpers.py): the runs beside this
    one (CI's other lanes, a newcomer guest's Visual) render too."""
    mine = f"-{os.getpid()}-"
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if not (b"chromium-headless-shell" in cmd or b"camg-render/shot.py" in cmd):
                    continue
                if mine in Path(f"/proc/{entry}/cgroup").read_text():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def assert_nothing_left(helper, svc) -> None:
    cc = ContainerClient(helper.socket, owner=OWNER)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = (cc.list(), cc.helper.list_sandboxes(), browser_pids())
            if left == ([], [], []):
                break
            time.sleep(0.5)
        assert left == ([], [], []), f"left behind (containers, sandboxes, browsers): {left}"
    finally:
        cc.close()
    shots = Path(svc.config["state_dir"]) / "screenshots"
    assert not [p for p in shots.glob(".*")], "a temporary screenshot file was left"


def play(url: str, task_id: str, actions: list[dict]) -> dict:
    client = Client(url, timeout=900)
    ep = client.create(task_id=task_id)
    reply = None
    for action in actions:
        reply = client.step(ep["episode_id"], action)
    return {"reset": ep, "final": reply}


def test_oracle_site_outscores_blank_through_the_service(service, prepared):
    oracle = prepared[1]
    task_id = sorted(oracle)[0]
    ref = play(service.url, task_id, oracle[task_id])
    blank = play(service.url, task_id, [{"operation": "shell", "command": "ls -la"},
                                        {"operation": "finish"}])
    assert "Tailwind" in ref["reset"]["observation"]["output"]
    r_ref, r_blank = ref["final"]["reward"], blank["final"]["reward"]
    assert ref["final"]["done"] and ref["final"]["failure_class"] is None
    assert 0 <= r_blank < r_ref <= 1, (r_blank, r_ref)
    shot = ref["final"]["observation"]["screenshot"]
    assert shot["width"] == 1440 and shot["height"] >= 900
    records = {r["episode_id"]: r for r in service.outcomes()}
    rec = records[ref["reset"]["episode_id"]]
    assert rec["reward"] == r_ref and rec["judge"]["judge_model"] == "fake-vision"
    assert rec["judge"]["judge_prompt_hash"].startswith("sha256:") and rec["judge"]["judge_raw"]
    path = Path(rec["screenshot"]["path"])
    assert path.is_file() and path.is_relative_to(service.config["state_dir"])
    import hashlib
    assert hashlib.sha256(path.read_bytes()).hexdigest() == rec["screenshot"]["sha256"]
    assert "sk-visual-test" not in Path(service.log_path).read_text(errors="replace")
    assert "sk-visual-test" not in json.dumps(Client(service.url).metadata())


def test_external_asset_crash_judge_failure_and_their_controls(service, prepared, judge):
    """An external asset is refused and the page judged without it; a page
    that crashes the renderer scores 0.0 obstructed once the control page
    renders; a judge that fails on the page but answers the control gives
    0.0 obstructed, one that fails the control too leaves judge_error null,
    one that fails once and then answers gives the page its score."""
    from tests.support.fake_judge import Reply

    task_id = sorted(prepared[1])[1]
    page = ('<!DOCTYPE html><script src="https://cdn.example.invalid/x.js"></script>'
            '<h1 style="background:#1d3557;color:#fff;height:300px">x</h1>')
    ext = play(service.url, task_id, [
        {"operation": "shell", "command": f"echo '{page}' > /workspace/dist/index.html"},
        {"operation": "finish"}])
    assert ext["final"]["reward"] > 0 and ext["final"]["failure_class"] is None
    from environments.visual.checks.canaries import CRASH
    crash = base64.b64encode(f"<!DOCTYPE html><p>x</p><script>{CRASH}</script>".encode()).decode()
    crashed = play(service.url, task_id, [
        {"operation": "shell", "command": f"echo {crash} | base64 -d > /workspace/dist/index.html"},
        {"operation": "finish"}])
    assert crashed["final"]["reward"] == 0.0 and crashed["final"]["failure_class"] is None
    # a delivery with symlinks out of dist/: tampered, 0.0, the judge not asked
    asked = len(judge.requests)
    linked = play(service.url, task_id, [
        {"operation": "shell", "command": "echo '<!DOCTYPE html><p>x</p>' > dist/index.html && "
         "ln -s /etc dist/etc && ln -s ../../ dist/up && ln -s index.html dist/home.html"},
        {"operation": "finish"}])
    assert linked["final"]["reward"] == 0.0 and linked["final"]["failure_class"] is None
    assert len(judge.requests) == asked
    records = {r["episode_id"]: r for r in service.outcomes()}
    got = records[linked["reset"]["episode_id"]]
    assert got["integrity"] == "tampered" and sorted(got["integrity_evidence"]) == [
        "symlink_out_of_dist: dist/etc -> /etc", "symlink_out_of_dist: dist/up -> ../../"]
    # the image the episode's container ran, signed into its record
    assert got["image"].count("@sha256:") == 1
    got = records[ext["reset"]["episode_id"]]
    assert got["integrity"] == "ok" and got["integrity_evidence"] == [
        "external_load: https://cdn.example.invalid/x.js (refused; shot without it)"]
    got = records[crashed["reset"]["episode_id"]]
    assert got["integrity"] == "obstructed" and got["grade_reason"] == "obstructed"
    assert got["integrity_evidence"][0].startswith("step failed (render_error)")
    assert any(e.startswith("control: a fixed control page rendered")
               for e in got["integrity_evidence"]), got["integrity_evidence"]
    # judge_attempts 2: the page's calls fail twice over, then the control's
    judge.script(*[Reply(status=500)] * 4)
    obstructed = play(service.url, task_id, prepared[1][task_id])
    assert obstructed["final"]["reward"] == 0.0 and obstructed["final"]["failure_class"] is None
    judge.script(*[Reply(status=500)] * 6)
    failed = play(service.url, task_id, prepared[1][task_id])
    assert failed["final"]["reward"] is None and failed["final"]["failure_class"] == "judge_error"
    judge.script(*[Reply(status=500)] * 2)
    passing = play(service.url, task_id, prepared[1][task_id])
    assert passing["final"]["reward"] > 0.8 and passing["final"]["failure_class"] is None
    records = {r["episode_id"]: r for r in service.outcomes()}
    assert records[obstructed["reset"]["episode_id"]]["integrity"] == "obstructed"
    assert records[failed["reset"]["episode_id"]].get("integrity") != "obstructed"


def test_stock_openenv_client_runs_an_episode(service, prepared):
    from openenv.core import GenericEnvClient
    from tests.support.token_clients import with_token

    task_id = sorted(prepared[1])[2]
    with with_token(GenericEnvClient)(base_url=service.url, message_timeout_s=900).sync() as env:
        result = env.reset(task_id=task_id)
        assert result.done is False and "Request" in result.observation["output"]
        result = env.step(prepared[1][task_id][0])
        assert result.done is False and result.observation["exit_code"] == 0
        result = env.step({"operation": "finish"})
        assert result.done is True and 0 < result.reward <= 1
        assert result.observation["screenshot"]["width"] == 1440


def test_eight_concurrent_episodes_leave_nothing(service, prepared):
    oracle = prepared[1]
    ids = sorted(oracle)
    results: list = [None] * 8
    errors: list = []

    def one(i: int) -> None:
        try:
            task_id = ids[i % len(ids)]
            actions = oracle[task_id] if i % 2 == 0 else [{"operation": "finish"}]
            results[i] = play(service.url, task_id, actions)["final"]
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not errors, errors
    assert all(r["done"] and r["failure_class"] is None for r in results), results
    assert min(results[0::2], key=lambda r: r["reward"])["reward"] > \
        max(results[1::2], key=lambda r: r["reward"])["reward"]


def test_kill_9_mid_render_then_restart_leaves_nothing(prepared, judge, visual_helper):
    svc = ServiceProcess(prepared[0], env=judge_env(judge)).wait_ready(120)
    task_id = sorted(prepared[1])[0]
    client = Client(svc.url, timeout=900)
    ep = client.create(task_id=task_id)
    client.step(ep["episode_id"], prepared[1][task_id][0])
    threading.Thread(target=lambda: _quiet(client.step, ep["episode_id"],
                                           {"operation": "finish"}), daemon=True).start()
    deadline = time.monotonic() + 60
    while not browser_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert browser_pids(), "the render never started"
    # kill -9 of the whole service (gunicorn master and worker), as systemd
    # does to a unit's cgroup; the helper and its renderer sandbox live on.
    for pid in [svc.proc.pid, *descendants(svc.proc.pid)]:
        os.kill(pid, signal.SIGKILL)
    svc.stop()
    assert browser_pids(), "the render outlives the killed service until released"
    # What a unit's ExecStopPost= does is not needed: a restarted service
    # releases what its previous instance left before it says READY.
    again = ServiceProcess(prepared[0], env=judge_env(judge)).wait_ready(120)
    try:
        time.sleep(1)
        cc = ContainerClient(visual_helper.socket, owner=OWNER)
        # only the new instance's warm pool may exist, and no sandbox or browser
        assert all(c["pool"] for c in cc.list()) and cc.helper.list_sandboxes() == []
        cc.close()
        assert browser_pids() == []
    finally:
        again.stop()
    assert_nothing_left(visual_helper, again)


def descendants(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                kids += [int(entry), *descendants(int(entry))]
    return kids


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass  # the service was killed under it


def test_prometheus_counts_the_oracle_and_the_blank(service, prepared, tmp_path):
    """A real Prometheus (devtools/harness/prometheus.py) scrapes this test's own
    service every second: its counts and histograms through /api/v1/query."""
    from devtools.harness.prometheus import PrometheusServer
    oracle = prepared[1]
    task_id = sorted(oracle)[0]
    env = 'environment="visual"'
    with PrometheusServer(tmp_path / "prom",
                          {"visual": service.url.removeprefix("http://")}) as prom:
        prom.wait_up()
        ref = play(service.url, task_id, oracle[task_id])
        blank = play(service.url, task_id, [{"operation": "finish"}])
        assert ref["final"]["reward"] > blank["final"]["reward"] >= 0
        prom.wait_for(f"sum by (outcome) (camg_episodes_ended_total{{{env}}})",
                      lambda got: got == {"done": 2}, by="outcome")
        assert prom.value(f'sum(camg_episodes_ended_total{{{env},failure_class!="none"}})') is None
        assert prom.value(f"sum(camg_episodes_started_total{{{env}}})") == 2
        assert prom.value(f"camg_step_seconds_count{{{env}}}") == len(oracle[task_id]) + 1
        assert prom.value(f"camg_grade_seconds_count{{{env}}}") == 2
        # two judge calls per episode (whether the page's text addresses its
        # evaluator -- the 404 page of the blank one has text too -- then the
        # vision verdict), and Visual talks to the helper
        assert prom.value(f'camg_judge_requests_total{{{env},result="ok"}}') == 4
        assert prom.value(f"camg_helper_up{{{env}}}") == 1
        prom.assert_plausible_histogram("camg_grade_seconds", env, 2, upper_s=300)
        prom.assert_plausible_histogram("camg_judge_seconds", env, 4, upper_s=60)
    records = {r["episode_id"]: r for r in service.outcomes()}
    for played in (ref, blank):
        tokens = records[played["reset"]["episode_id"]]["cost"]["judge_tokens"]
        assert tokens["total_tokens"] > 0, tokens
