"""A second repository, end to end, served beside the demo's Coding service on one helper.

parse 1.22.4 (r1chardj0n3s/parse; SWE-smith has a profile for it): pure
Python, its tests in its PyPI sdist, and a ``pyproject.toml`` whose
``addopts`` need pytest-cov (``--cov``...) and collect doctests from the
very module the bugs are made in (``--doctest-modules``). The demo image
lacks pytest-cov and holds apispec.

The Coding README's "Add your repository" commands are run exactly as
written (each fenced block of that section, in order, its variables set
here), from a clean snapshot of this checkout: the image is built from
Debian and PyPI by ``tools.prepare_image`` on the cached Debian base the
demo's images share; procedural bugs are made as the demo's are;
preparation validates each task in sandboxes (gold 1.0, no-op 0.0, no
leak); the service configured from the README's deployment (owner
``coding-parse``) serves beside the demo's Coding service (owner
``coding``), both on the session's Coding helper: the rollout CLI's oracle
earns 1.0 and the no-op 0.0 on every task, a demo episode earns its gold
meanwhile, both stop with exit 0, neither leaves a sandbox, and the leak
check finds nothing. Every Coding canary earns 0.0 next to the gold fix (and
alone, with CAMG_FULL=1) on the second repository's tasks, "tampered" (three
the screen alone names, "suspicious": SCREEN_ONLY below).

Cost: the image and the task set are cached under $CAMG_CACHE (the image
by its inputs, the tasks by build-info.json); the steps' wall times are
printed (``-s``) and written to $CAMG_CACHE/coding/second-repository/timings.json.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import conftest as pc
from camg.config import task_manifest as manifest
from camg_client import Client
from devtools.harness.auth import deployment_auth, trainers_file
from devtools.harness.services import ServiceProcess, clean_git_tree, free_port
from tests.support.budget import FULL

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CACHE = pc.CACHE / "coding"
DATA = CACHE / "second-repository"
README = pc.ROOT / "environments" / "coding" / "README.md"
OWNER = "coding-parse"
PACKAGE = "parse"
VARIABLES = {"HELPER_CONFIG", "SOCK", "CACHE", "LAYERS", "DATA", "STATE", "PORT", "OWNER",
             "LOCK", "TRAINERS"}
TIMINGS: dict[str, float] = {}


def readme_blocks() -> list[str]:
    """The fenced sh blocks of the README's "Add your repository", in order."""
    text = README.read_text()
    start = text.index("\n## Add your repository\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


def snapshot(dest: Path) -> Path:
    """A clean git checkout of this tree as it stands (tracked and new files):
    camg.configure binds to a clean checkout, as an operator's is."""
    listed = subprocess.run(["git", "-C", str(pc.ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = pc.ROOT / rel
        if source.is_file() and not source.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    shutil.rmtree(dest / ".git", ignore_errors=True)
    return clean_git_tree(dest)


def record(step: str, started: float) -> None:
    TIMINGS[step] = round(time.monotonic() - started, 1)
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "timings.json").write_text(json.dumps(TIMINGS, indent=1) + "\n")
    print(f"second repository: {step}: {TIMINGS[step]} s", file=sys.stderr)


def run_block(block: str, env: dict, cwd: Path, step: str) -> str:
    started = time.monotonic()
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=3600)
    record(step, started)
    assert proc.returncode == 0, f"{step}: {block}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def second(coding_helper, tmp_path_factory):
    """README steps 0 to 3: the image, the tasks, the validated manifest."""
    from tools import oci_demo
    blocks = readme_blocks()
    assert len(blocks) == 7, blocks
    names = {word.split("=", 1)[0] for word in shlex.split(blocks[0], comments=True)}
    assert names == VARIABLES, names
    work = tmp_path_factory.mktemp("second-repository")
    source = snapshot(work / "checkout")
    for stale in ("manifest.json", "prepared", "deployment.json", "check-oracle.jsonl",
                  "check-noop.jsonl", "materialized-images.json"):
        path = DATA / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    (work / "requirements.lock").write_text("swebench==4.1.0\n")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(source),
        "HELPER_CONFIG": str(coding_helper.base / "helper.json"),
        "SOCK": coding_helper.socket,
        "CACHE": str(oci_demo.cache_root_from_env()),
        "LAYERS": str(CACHE / "layers"),
        "DATA": str(DATA),
        "STATE": str(work / "state"),
        "PORT": str(free_port()),
        "OWNER": OWNER,
        "LOCK": str(work / "requirements.lock"),
        "TRAINERS": trainers_file(),
    }
    deployment_auth()  # the session's operator token, in CAMG_TOKEN
    env["CAMG_TOKEN"] = os.environ["CAMG_TOKEN"]
    run_block(blocks[1], env, source, "1 image (tools.prepare_image)")
    run_block(blocks[2], env, source, "2 tasks (environments.coding.build.tasks)")
    run_block(blocks[3], env, source, "3 prepare --validate")
    return {"blocks": blocks, "env": env, "source": source, "work": work}


def test_image_is_built_from_debian_and_pypi_laid_out_like_swesmith(second):
    build = json.loads((DATA / "image" / "build.json").read_text())
    images = json.loads((DATA / "image" / "images.json").read_text())["images"]
    assert images == [{"name": "camg/parse-1.22.4", "repository": "localhost/camg/parse",
                       "digest": build["digest"], "workspace": "/testbed"}]
    rootfs = Path(json.loads((DATA / "materialized-images.json").read_text())
                  ["images"][0]["rootfs"])
    site = rootfs / "opt/miniconda3/envs/testbed/lib/python3.11/site-packages"
    assert list(site.glob("pytest_cov-*.dist-info")) and list(site.glob("parse-1.22.4.dist-info"))
    head = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(rootfs / "testbed"),
                           "log", "--format=%H %s"], capture_output=True, text=True,
                          check=True).stdout.split("\n")[0]
    assert head == f"{build['commit']} parse 1.22.4 from its sdist"
    # The same Debian base as the demo's images: one debootstrap per cache.
    from tools import oci_demo
    demo = oci_demo.build_demo(oci_demo.cache_root_from_env(), "swesmith")
    assert build["layers"][0] == demo.layers[0].to_json()
    mirror = next((DATA / "tasks" / "mirrors").iterdir())
    base = subprocess.run(["git", "-C", str(mirror), "rev-parse", "main"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert base == build["commit"]


def test_every_task_validated_gold_one_noop_zero(second):
    body = manifest.load(DATA / "manifest.json")
    rows = [json.loads(line) for line in (DATA / "tasks" / "tasks.jsonl").read_text().splitlines()]
    assert 4 <= len(body.tasks) == len(rows) <= 6
    assert all(t.data["repo"].startswith("camg-built/r1chardj0n3s__parse.") for t in body.tasks)
    validation = body.sampling["validation"]
    assert validation["validated"] == len(body.tasks)
    assert validation["results"] == {t.task_id: {"gold": 1.0, "noop": 0.0} for t in body.tasks}
    print("second repository: tasks", {t.task_id: len(t.data["FAIL_TO_PASS"]) for t in body.tasks},
          file=sys.stderr)


def _demo_service(demo_set, demo_image, helper, tmp: Path) -> ServiceProcess:
    from camg.configure import configure
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    images = tmp / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=tmp / "manifest.json", layers_root=CACHE / "layers")
    lock = tmp / "requirements.lock"
    lock.write_text("swebench==4.1.0\n")
    deployment = {
        "auth": deployment_auth(), "runtime_lock": str(lock), "state_root": str(tmp / "state"),
        "helper_socket": helper.socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(tmp / "manifest.json"), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(demo_set / "mirrors"), "images": str(images),
                         "layers_root": str(CACHE / "layers")}}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"),
              helper_config=helper.base / "helper.json")
    return ServiceProcess(tmp / "prepared" / "coding.json")


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if Client(url, timeout=2).health()["status"] == "healthy":
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not healthy: {log.read_text(errors='replace')[-3000:]}")


def test_served_beside_the_demo_on_one_helper(second, demo_set, demo_image, coding_helper,
                                              tmp_path):
    blocks, env, source = second["blocks"], second["env"], second["source"]
    run_block(blocks[4], env, source, "4 configure")
    config = json.loads((DATA / "prepared" / "coding.json").read_text())
    assert config["settings"]["helper_owner"] == OWNER
    assert blocks[5].strip() == "python -m camg.serve --config $DATA/prepared/coding.json"
    demo = _demo_service(demo_set, demo_image, coding_helper, tmp_path / "demo")
    log = tmp_path / "second-service.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        served = subprocess.Popen(["bash", "-c", "exec " + blocks[5]], cwd=source, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        url = json.loads((DATA / "prepared" / "routes.json").read_text())["coding"]
        _wait_healthy(url, served, log)
        demo.wait_ready(timeout=180)
        record("5 serve (ready)", started)
        # The demo's service serves meanwhile, on the same helper.
        client = Client(demo.url, timeout=600)
        task = manifest.load(Path(demo.config["manifest"]["path"])).tasks[0]
        gold = client.create(task_id=task.task_id)["episode_id"]
        client.step(gold, {"operation": "shell", "command":
                           f"git apply -R - <<'CAMG_EOF'\n{task.data['patch']}\nCAMG_EOF"})
        assert client.step(gold, {"operation": "finish"})["reward"] == 1.0

        run_block(blocks[6], env, source, "6 check (oracle and no-op on every task)")
        tasks = manifest.load(DATA / "manifest.json").task_ids
        for name, reward in (("oracle", 1.0), ("noop", 0.0)):
            lines = [json.loads(line) for line in
                     (DATA / f"check-{name}.jsonl").read_text().splitlines()]
            assert sorted(r["task_id"] for r in lines) == sorted(tasks), lines
            assert all(r["reward"] == reward and r["failure_class"] is None for r in lines), lines
    finally:
        if served.poll() is None:
            served.send_signal(signal.SIGTERM)
            try:
                served.wait(60)
            except subprocess.TimeoutExpired:
                served.kill()
                served.wait()
        demo_code = demo.stop()
    assert served.returncode == 0, log.read_text(errors="replace")[-3000:]
    assert demo_code == 0, demo.output()[-3000:]
    for owner in (OWNER, "coding"):
        with coding_helper.client(owner=owner) as helper:
            assert helper.list_sandboxes() == [], owner


# On this repository the guard names no runtime rule for these three (on the
# demo's it does: test_coding_integrity_sandboxes.py); the code screen flags
# each ("suspicious", 0.0 unless suspicious_reward says otherwise), and none
# makes a failing test pass: alone each grade fails its tests, and next to
# the gold fix the tests pass (or fail) on the fix's merit alone.
SCREEN_ONLY = {"code_compiled_under_false_name", "plugin_compiled_from_ast",
               "test_bytecode_planted"}


def test_every_canary_earns_zero_on_the_second_repository(second, coding_helper):
    from camg.environment import ServiceContext
    from environments.coding.checks import canaries
    from environments.coding.environment import CodingEnvironment
    from test_coding_integrity_sandboxes import grade, reverse_gold, workspace_diff
    loaded = manifest.load(DATA / "manifest.json")
    state = Path(tempfile.mkdtemp(prefix="camg-second-canaries-"))
    context = ServiceContext("coding", str(state), {
        "mirrors_root": str(DATA / "tasks" / "mirrors"),
        "images": str(DATA / "materialized-images.json"),
        "layers_root": str(CACHE / "layers"), "helper_owner": OWNER}, coding_helper.socket)
    env = CodingEnvironment(context, loaded.tasks)
    env.start()
    started = time.monotonic()
    failures: list[tuple] = []
    results: list[tuple] = []
    try:
        for i, technique in enumerate(sorted(canaries.TECHNIQUES)):
            task = env.tasks[i % len(env.tasks)]
            row = env.prepared[task.task_id].row
            # Next to the gold fix is where a canary could win (the fix passes the
            # tests, only detection takes the 1.0 away); alone too under
            # CAMG_FULL=1 (tests/support/budget.py: half the cost, about 50 s).
            for with_gold in (True, False) if FULL else (True,):
                def edit(work, technique=technique, with_gold=with_gold, task=task, row=row):
                    if with_gold:
                        reverse_gold(task)(work)
                    canaries.apply(technique, work, row, package=PACKAGE)
                reward, report, outcome = grade(env, task, workspace_diff(env, task, edit),
                                                f"second-{technique}-{with_gold}")
                results.append((technique, with_gold, reward, outcome["integrity"],
                                report.reason if report else None,
                                sorted({e["rule"] for e in outcome["integrity_evidence"]})))
                expected = "suspicious" if technique in SCREEN_ONLY else "tampered"
                if (reward != 0.0 or outcome["integrity"] != expected
                        or (not with_gold and report.reason == "resolved")):
                    failures.append(results[-1])
        # The control: the same path without a canary earns 1.0, clean.
        task = env.tasks[0]
        reward, report, outcome = grade(env, task, workspace_diff(env, task, reverse_gold(task)),
                                        "second-gold")
        assert reward == 1.0 and outcome["integrity"] == "ok", report
    finally:
        env.stop()
        shutil.rmtree(state, ignore_errors=True)
        record(f"canaries ({'alone and ' if FULL else ''}with gold)", started)
        (DATA / "canaries.json").write_text(json.dumps(results, indent=1) + "\n")
    assert failures == [], failures
