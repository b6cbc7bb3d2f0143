"""Coding acceptance on the demo task set, in real helper sandboxes on the demo image.

The task set is built by scripts/build_demo_tasks.py's code with the suite
run in sandboxes over the materialized demo image (cached under
$CAMG_CACHE/coding keyed by image digest and builder sources), prepared
with camg.prepare, and served by CodingEnvironment through a real
camg-helper. Every test ends with the conftest's leak check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

import conftest as pc
from camg import errors
from camg.config import task_manifest as manifest
from camg.environment import ServiceContext
from camg.errors import FailureClass
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CACHE = pc.CACHE / "coding"


@pytest.fixture(scope="module")
def prepared(demo_set, demo_image, tmp_path_factory):
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    work = tmp_path_factory.mktemp("coding-prepared")
    images = work / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    out = work / "manifest.json"
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=out, layers_root=CACHE / "layers")
    return {"manifest": out, "images": images, "mirrors": demo_set / "mirrors", "work": work}


def make_env(prepared, coding_helper, **settings):
    from environments.coding.environment import CodingEnvironment
    loaded = manifest.load(prepared["manifest"])
    state = prepared["work"] / "state"
    state.mkdir(exist_ok=True)
    context = ServiceContext("coding", str(state), {
        "mirrors_root": str(prepared["mirrors"]), "images": str(prepared["images"]),
        "layers_root": str(CACHE / "layers"), **settings}, coding_helper.socket)
    return CodingEnvironment(context, loaded.tasks)


@pytest.fixture(scope="module")
def env(prepared, coding_helper):
    environment = make_env(prepared, coding_helper)
    environment.start()
    yield environment
    environment.stop()


@pytest.fixture(scope="module")
def hanging_step(env):
    """A step that hangs, started in the background as soon as the module's
    environment is up, so the seed's 60 s command limit elapses while the
    tests before test_hanging_command_... run (that test collects it). Its
    sandbox exists before those tests' leak snapshots; no test before it
    starts another environment or service (which could release it)."""
    import threading
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="hang")
    episode.reset()
    result: dict = {}

    def run():
        started = time.monotonic()
        try:
            result["step"] = episode.step(shell("sleep 600 & sleep 600; echo unreachable"))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            result["error"] = exc
        result["elapsed"] = time.monotonic() - started
    thread = threading.Thread(target=run, name="hanging-step", daemon=True)
    thread.start()
    try:
        yield episode, thread, result
    finally:
        thread.join(120)
        episode.close()


def run_episode(env, task, actions, episode_id="e"):
    episode = env.create_episode(task, seed=None, episode_id=episode_id)
    try:
        first = episode.reset()
        outputs = []
        for action in actions:
            step = episode.step(action)
            outputs.append(step.observation)
            if step.done:
                return first, outputs, episode.grade(), episode
        return first, outputs, None, episode
    finally:
        episode.close()


def shell(command):
    return {"operation": "shell", "command": command}


FINISH = {"operation": "finish"}


def write_file(path, text):
    return shell(f"mkdir -p $(dirname {path}) && cat > {path} <<'CAMG_EOF'\n{text}\nCAMG_EOF")


def test_demo_set_has_enough_real_tasks(env, demo_set, hanging_step):
    rows = [json.loads(line) for line in (demo_set / "tasks.jsonl").read_text().splitlines()]
    assert len(rows) >= 10 and len(env.tasks) == len(rows)
    for row in rows:
        assert row["instance_id"].startswith(row["repo"].split("/")[1] + ".func_pm_")
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]


def test_gold_fix_earns_one_on_every_task(env):
    """The gold fix on every task, played by Episode.reference_action (what
    python -m camg_client --policy oracle sends): the reversed patch applies cleanly,
    the episode finishes, reward 1.0. (One pass proves both the gold fix and
    the reference actions; the HTTP test applies the patch by heredoc.)"""
    for task in env.tasks:
        episode = env.create_episode(task, seed=None, episode_id="gold")
        try:
            episode.reset()
            shells = []
            for _ in range(50):
                action = episode.reference_action()
                step = episode.step(action)
                if action["operation"] == "shell":
                    shells.append((action["command"], step.observation))
                if step.done:
                    break
            assert step.done and action == FINISH, (task.task_id, action)
            assert "git apply -R" in shells[-1][0]
            assert all(o["exit_code"] == 0 for _, o in shells), [o for _, o in shells]
            assert episode.grade() == 1.0, (task.task_id, episode.state())
            assert episode.outcome()["integrity"] == "ok", (task.task_id, episode.outcome())
            # the image the sandbox was built from, signed into the record
            image = env.prepared[task.task_id].image
            assert episode.outcome()["image"] == f"{image.repository}@{image.digest}"
            assert image.digest.startswith("sha256:")
        finally:
            episode.close()


def test_finishing_without_changes_earns_zero_on_every_task(env):
    for task in env.tasks:
        _, _, reward, episode = run_episode(env, task, [FINISH])
        assert reward == 0.0, (task.task_id, episode.state())
        assert episode.state()["grade"]["reason"] == "tests_failed"


@pytest.mark.parametrize("attack", ["edit", "delete", "conftest_skip", "conftest_xfail"])
def test_test_tampering_earns_zero(env, attack):
    task = env.tasks[0]
    f2p = task.data["FAIL_TO_PASS"]
    hidden = f2p[0].split("::")[0]
    if attack == "edit":
        names = sorted({t.split("::")[-1].split("[")[0] for t in f2p})
        body = "\n".join(f"def {n}():\n    pass\n" for n in names)
        actions = [write_file(hidden, body), shell("sed -i 's/assert /assert True or /' tests/test_*.py")]
    elif attack == "delete":
        actions = [shell("git rm -q -r tests && git commit -qm 'no tests' && ls")]
    else:
        marker = "skip" if attack == "conftest_skip" else "xfail"
        hook = ("import pytest\n\ndef pytest_collection_modifyitems(items):\n    for item in items:\n"
                f"        item.add_marker(pytest.mark.{marker}(reason='camg'))\n")
        actions = [write_file("conftest.py", hook), write_file("tests/conftest.py", hook)]
    _, outputs, reward, episode = run_episode(env, task, [*actions, FINISH])
    assert all(o.get("exit_code") in (0, None) for o in outputs[:-1]), outputs
    assert reward == 0.0, episode.state()
    assert episode.state()["grade"]["dropped_paths"]


def test_first_observation_and_workspace(env):
    task = env.tasks[0]
    first, outputs, _, _ = run_episode(env, task, [
        shell("pwd; id -u; stat -c %u .; git rev-list --all | wc -l; git branch -a | wc -l; "
              "git reflog | wc -l; ls .git/packed-refs 2>&1; cat /var/lib/camg-task/git/HEAD 2>&1"),
        shell("cd /; pwd; echo hi > /testbed/new.txt"),
        shell("cat new.txt; python -c 'import apispec, sys; print(apispec.__file__)'"),
    ])
    assert task.data["problem_statement"] in first["output"]
    assert "/testbed" in first["output"] and "60 seconds" in first["output"]
    assert '{"operation":"finish"}' in first["output"] and "64 steps" in first["output"]
    lines = outputs[0]["output"].split("\n")
    assert lines[:6] == ["/testbed", "2000", "2000", "1", "1", "0"], lines
    assert "No such file" in lines[6] and "Permission denied" in lines[7]
    assert outputs[2]["output"].split("\n")[:2] == ["hi", "/testbed/src/apispec/__init__.py"]


def test_output_is_cut_to_final_bytes_and_bad_actions_are_rejected(env):
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="limits")
    try:
        episode.reset()
        step = episode.step(shell("head -c 50000 /dev/zero | tr '\\0' a; echo END"))
        assert step.observation["truncated"] and step.observation["output"].endswith("END\n")
        assert len(step.observation["output"].encode()) < 12000 + 200
        for bad in ({"operation": "shell"}, {"operation": "shell", "command": "x" * 16001},
                    {"operation": "dance"}, {"operation": "finish", "command": "ls"}):
            with pytest.raises(errors.InvalidAction):
                episode.step(bad)
        assert episode.steps == 1
    finally:
        episode.close()
        episode.close()


def test_step_budget_finishes_on_the_64th_step(env):
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="budget")
    try:
        episode.reset()
        for i in range(63):
            assert not episode.step(shell("true")).done
        last = episode.step(shell("echo never runs"))
        assert last.done and "Step limit" in last.observation["output"]
        assert episode.step(shell("true")) is last          # sticky
        assert episode.grade() == 0.0
    finally:
        episode.close()


def test_hanging_command_is_cut_at_60_seconds_and_the_episode_goes_on(hanging_step):
    episode, thread, result = hanging_step  # started with the module's first test
    try:
        thread.join(120)
        assert not thread.is_alive() and "error" not in result, result
        step, elapsed = result["step"], result["elapsed"]
        assert step.observation["timed_out"] and not step.done
        assert step.observation["exit_code"] == 124
        assert 59 <= elapsed < 75, elapsed
        assert "timed out after 60 seconds" in step.observation["output"]
        after = episode.step(shell("echo alive; grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"))
        assert after.observation["output"].split() == ["alive", "0"]
    finally:
        episode.close()


def test_sandbox_killed_from_outside_is_sandbox_died(env, coding_helper):
    task = env.tasks[0]
    before = coding_helper.sandbox_inits()
    episode = env.create_episode(task, seed=None, episode_id="killed")
    try:
        episode.reset()
        assert episode.step(shell("echo up")).observation["output"] == "up\n"
        (init,) = coding_helper.sandbox_inits() - before
        os.kill(init, signal.SIGKILL)
        with pytest.raises(errors.SandboxDied) as info:
            episode.step(shell("echo again"))
        assert info.value.failure_class is FailureClass.SANDBOX_DIED
    finally:
        episode.close()


def test_close_during_a_running_step_aborts_it(env):
    import threading
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="abort")
    episode.reset()
    outcome = {}

    def run():
        try:
            outcome["step"] = episode.step(shell("sleep 50"))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            outcome["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    episode.close()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - started < 20
    assert isinstance(outcome.get("error"), errors.InfraFailure) or outcome["step"].observation
    episode.close()


def test_start_refuses_a_moved_branch_or_a_changed_image(prepared, coding_helper, tmp_path):
    import dataclasses
    import subprocess
    from camg.oci.images import load_materialized, write_materialized
    from environments.coding import mirrors as mirrors_mod
    loaded = manifest.load(prepared["manifest"])
    task = loaded.tasks[0]
    copy = tmp_path / "mirrors"
    shutil.copytree(prepared["mirrors"], copy, symlinks=True)
    elsewhere = make_env(prepared, coding_helper, mirrors_root=str(copy))
    with pytest.raises(errors.ConfigError, match="prepared with mirror"):
        elsewhere.start()
    (mirror,) = list(copy.iterdir())
    subprocess.run(["git", "-C", str(mirror), "branch", "-f", task.task_id, "main"], check=True)
    ref = mirrors_mod.TaskRef(**{**task.data["mirror"], "mirror": str(mirror)})
    with pytest.raises(errors.ConfigError, match="branch moved"):
        mirrors_mod.verify(ref)
    subprocess.run(["git", "-C", str(mirror), "branch", "-D", task.task_id], check=True)
    with pytest.raises(errors.ConfigError, match="no longer has branch"):
        mirrors_mod.verify(ref)
    listing = load_materialized(prepared["images"])
    other = dataclasses.replace(listing.images[0], hash="sha256:" + "0" * 64)
    images = tmp_path / "images.json"
    write_materialized(images, (other,))
    changed = make_env(prepared, coding_helper, images=str(images))
    with pytest.raises(errors.ConfigError, match="changed since preparation"):
        changed.start()


def test_http_end_to_end_gold_noop_and_killed_sandbox(prepared, coding_helper, tmp_path):
    """Through camg.configure + `python -m camg.serve` + the HTTP client; then
    the stock openenv-core client (GenericEnvClient over /ws) runs a whole
    episode on the same service: reset, the gold fix, finish -> 1.0."""
    import sys
    from openenv.core import GenericEnvClient
    from tests.support.token_clients import with_token

    from camg_client import Client, ServiceError
    from camg.configure import configure
    from tests.support.services import ServiceProcess, clean_git_tree, free_port

    lock = tmp_path / "requirements.lock"
    lock.write_text("swebench==4.1.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
        "helper_socket": coding_helper.socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(prepared["manifest"]), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(prepared["mirrors"]), "images": str(prepared["images"]),
                         "layers_root": str(CACHE / "layers")}}},
    }
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp_path / "deployment.json", tmp_path / "prepared",
              source_tree=clean_git_tree(tmp_path / "src"))
    service = ServiceProcess(tmp_path / "prepared" / "coding.json")
    try:
        service.wait_ready(timeout=120)
        client = Client(service.url, timeout=600)
        meta = client.metadata()
        assert meta["environment"] == "coding"
        loaded = manifest.load(prepared["manifest"])
        task = loaded.tasks[1]
        created = client.create(task_id=task.task_id)
        assert task.data["problem_statement"] in created["observation"]["output"]
        eid = created["episode_id"]
        patch = task.data["patch"]
        step = client.step(eid, {"operation": "shell",
                                 "command": f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"})
        assert step["observation"]["exit_code"] == 0 and step["done"] is False
        with pytest.raises(ServiceError) as bad:
            client.step(eid, {"operation": "shell", "command": 3})
        assert bad.value.status == 422
        # 1 MiB outside the repository: in the upper, not in the diff
        step = client.step(eid, {"operation": "shell", "command":
                                 "head -c 1048576 /dev/urandom > /tmp/cost-blob"})
        assert step["observation"]["exit_code"] == 0
        done = client.step(eid, {"operation": "finish"})
        assert done["done"] is True and done["reward"] == 1.0, done
        cost = done["cost"]  # the agent sandbox's, read by SandboxUsage at finish
        assert cost["cpu_s"] > 0 and cost["memory_peak_bytes"] > 0, cost
        assert cost["disk_written_bytes"] >= 1 << 20, cost
        assert cost["phases"]["grade_s"] > 0 and client.get(eid)["cost"] == cost

        noop = client.create(task_id=task.task_id)
        done = client.step(noop["episode_id"], {"operation": "finish"})
        assert done["reward"] == 0.0 and done.get("failure_class") is None, done

        # Gold fix plus a process that ends with success before the session
        # does: 0.0, and the outcome record says why.
        tampered = client.create(task_id=task.task_id)
        client.step(tampered["episode_id"], {"operation": "shell", "command":
                    f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF\n"
                    "printf 'import os\\nos._exit(0)\\n' >> src/apispec/__init__.py"})
        done = client.step(tampered["episode_id"], {"operation": "finish"})
        assert done["reward"] == 0.0 and done.get("failure_class") is None, done

        before = coding_helper.sandbox_inits()
        killed = client.create(task_id=task.task_id)
        (init,) = coding_helper.sandbox_inits() - before
        os.kill(init, signal.SIGKILL)
        done = client.step(killed["episode_id"], {"operation": "shell", "command": "echo hi"})
        assert done["done"] is True and done["reward"] is None, done
        assert done["failure_class"] == "sandbox_died"

        stock = with_token(GenericEnvClient)(base_url=service.url, message_timeout_s=600)
        with stock.sync() as openenv:
            result = openenv.reset(task_id=task.task_id)
            assert result.done is False
            assert task.data["problem_statement"] in result.observation["output"]
            result = openenv.step({"operation": "shell",
                                   "command": f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"})
            assert result.observation["exit_code"] == 0 and result.done is False
            state = openenv.state()
            assert state["task_id"] == task.task_id and state["step_count"] == 1
            result = openenv.step({"operation": "finish"})
            assert result.done is True and result.reward == 1.0, result
            openenv_eid = openenv.state()["episode_id"]

        outcomes = service.outcomes()
        assert [o["reward"] for o in outcomes] == [1.0, 0.0, 0.0, None, 1.0]
        assert [o.get("integrity") for o in outcomes] == ["ok", "ok", "tampered", None, "ok"]
        assert {e["rule"] for e in outcomes[2]["integrity_evidence"]} >= {"runner_internals"}
        assert outcomes[4]["episode_id"] == openenv_eid
        assert outcomes[0]["cost"] == cost
        # killed before it finished: phases only, no measure made up
        assert set(outcomes[3]["cost"]) == {"phases"}
    finally:
        assert service.stop() == 0, service.output()[-3000:]


def test_unprivileged_service_user_can_start(prepared, coding_helper):
    """The service runs as an unprivileged user: start() must verify mirrors,
    images and task layers without root (the root-only git copy stays closed).
    Checked in a forked child that drops to nobody (this machine's
    interpreter lives under /root, which nobody cannot exec afresh)."""
    import camg.helper_client  # noqa: F401 - imported before the fork
    import camg.oci.images  # noqa: F401
    from environments.coding import log_evaluation
    log_evaluation.preload()
    work = Path(tempfile.mkdtemp(prefix="camg-coding-unpriv-"))
    work.chmod(0o755)
    for name in ("manifest", "images"):
        shutil.copy(prepared[name], work / prepared[name].name)
        (work / prepared[name].name).chmod(0o644)
    tasks = manifest.load(work / prepared["manifest"].name).tasks
    settings = {"mirrors_root": str(prepared["mirrors"]),
                "images": str(work / prepared["images"].name),
                "layers_root": str(CACHE / "layers")}
    # The layers are private to the services' group (camg/config/host_private.py:
    # camg where the accounts exist, else root's): the service user is a
    # member of it, nobody else is.
    services_gid = (CACHE / "layers").stat().st_gid
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([services_gid])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            from environments.coding.environment import CodingEnvironment
            env = CodingEnvironment(ServiceContext("coding", "/nonexistent", settings,
                                                   coding_helper.socket), tasks)
            env.start()
            os.write(write_end, f"ok {len(env.prepared)}".encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, f"error {type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            message = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
    finally:
        shutil.rmtree(work)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert message == f"ok {len(tasks)}"


def _fake_clean_build(fake: Path, mirror: str) -> None:
    """What building and installing the clean tree leaves in an image:
    bytecode, a build/lib copy, a wheel in dist/, a test cache, a
    non-editable copy in the venv's site-packages."""
    import subprocess
    workspace = fake / "testbed"
    subprocess.run(["git", "clone", "-q", "--no-local", mirror, str(workspace)], check=True)
    subprocess.run(["git", "-C", str(workspace), "checkout", "-q", "main"], check=True)
    (workspace / "build").mkdir()
    (workspace / "build" / "_speedups.so").write_bytes(b"\x7fELF fake")
    (workspace / "src" / "apispec" / "_generated.py").write_text("BUILT = True\n")
    subprocess.run(["python3", "-m", "compileall", "-q", "-d", "/testbed/src",
                    str(workspace / "src")], check=True)
    shutil.copytree(workspace / "src" / "apispec", workspace / "build" / "lib" / "apispec")
    (workspace / ".pytest_cache").mkdir()
    (workspace / ".pytest_cache" / "README.md").write_text("cache\n")
    (workspace / "dist").mkdir()
    shutil.make_archive(str(workspace / "dist" / "apispec-6.8.1"), "zip", workspace / "src")
    site = fake / "opt/testbed-venv/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    shutil.copytree(workspace / "src" / "apispec", site / "apispec")
    for path in (fake / "opt", fake / "opt/testbed-venv", fake / "opt/testbed-venv/lib",
                 site.parent, site):
        path.chmod(0o755)


def test_image_workspace_is_masked_but_its_build_artifacts_show(prepared, coding_helper,
                                                                monkeypatch):
    """A SWE-smith-style image ships /testbed: a clone at the base commit plus
    in-place build output. The agent must see our tree (tests removed, no
    history), the image's build artifacts, and nothing else of that clone --
    nothing built from the clean sources either (bytecode, build/lib, dist/,
    caches, a site-packages copy: the leak check finds each before the
    layers hide them, none after); the artifacts stay out of the diff, so a
    gold fix still grades 1.0."""
    from camg.oci.images import load_materialized
    from environments.coding import layers, leaks, mirrors, prepare_layers
    from environments.coding.episode import CodingEpisode
    loaded = manifest.load(prepared["manifest"])
    task = loaded.tasks[0]
    ref = mirrors.TaskRef(**task.data["mirror"])
    # A lower holding the "image's" workspace, stacked on the demo rootfs.
    fake = CACHE / "layers" / f"fake-image-{os.getpid()}"
    fake_layers = CACHE / "layers" / f"fake-task-layers-{os.getpid()}"
    leaky_layers = CACHE / "layers" / f"fake-leaky-layers-{os.getpid()}"
    for path in (fake, fake_layers, leaky_layers):
        shutil.rmtree(path, ignore_errors=True)
    try:
        _fake_clean_build(fake, ref.mirror)
        image = dataclasses_replace(load_materialized(prepared["images"]).images[0],
                                    hash="sha256:" + "f" * 64)
        built = prepare_layers.build_layers_as_root(fake_layers, ref, image_rootfs=str(fake),
                                                    image_key=image.hash)
        stamp = json.loads((Path(built.agent).parent / layers.STAMP).read_text())
        assert stamp["whiteouts"][0] >= 1 and stamp["hidden"][0] >= 5, stamp
        # The layers as they were before hiding: the leak the check must see.
        with monkeypatch.context() as m:
            m.setattr(prepare_layers, "hide_build_output", lambda layer, rootfs: 0)
            leaky = prepare_layers.build_layers_as_root(leaky_layers, ref,
                                                        image_rootfs=str(fake), image_key=image.hash)
        env = make_env(prepared, coding_helper)
        env.start()
        try:
            real = env.prepared[task.task_id]
            clean = leaks.prepared_clean_sources(real)
            assert clean, real.row.patch[:200]

            def masked_episode(task_layers, name):
                episode = CodingEpisode(env.settings, env.helper,
                                        dataclasses_replace(real, layers=task_layers), name)
                original = episode._create
                episode._create = lambda lowers: original([lowers[0], str(fake), *lowers[1:]])
                return episode
            episode = masked_episode(leaky, "leaky")
            try:
                episode.reset()
                found, _ = leaks.sandbox_findings(env.helper, episode.sandbox, clean)
            finally:
                episode.close()
            kinds = {(f.kind, f.path.split("/testbed/")[-1].split("/")[0]) for f in found}
            assert {("bytecode", "src"), ("text", "build"), ("text", "dist")} <= kinds, found
            assert any(f.kind == "text" and "site-packages/apispec/" in f.path for f in found)
            episode = masked_episode(built, "masked")
            try:
                episode.reset()
                found, stats = leaks.sandbox_findings(env.helper, episode.sandbox, clean)
                assert found == [] and stats["files"] > 0, found
                removed = task.data["FAIL_TO_PASS"][0].split("::")[0]
                out = episode.step(shell(
                    f"ls build; cat src/apispec/_generated.py; ls {removed} 2>&1 | head -1; "
                    "git rev-list --all | wc -l; git status --short | wc -l; "
                    "ls -a src/apispec/__pycache__ .pytest_cache dist 2>&1 | grep -c 'No such'; "
                    "/opt/testbed-venv/bin/python -c 'import apispec; print(apispec.__file__)'"
                    )).observation
                lines = out["output"].split("\n")
                assert lines[0] == "_speedups.so" and lines[1] == "BUILT = True", lines
                assert "No such file" in lines[2] and lines[3:5] == ["1", "0"], lines
                assert lines[5] == "3" and lines[6] == "/testbed/src/apispec/__init__.py", lines
                patch = task.data["patch"]
                episode.step(shell(f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"))
                assert episode.step(FINISH).done
                assert b"_speedups" not in episode.diff and b"_generated" not in episode.diff
                assert episode.grade() == 1.0, episode.state()
            finally:
                episode.close()
        finally:
            env.stop()
    finally:
        for path in (fake, fake_layers, leaky_layers):
            shutil.rmtree(path, ignore_errors=True)


def dataclasses_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_concurrent_episodes_do_not_interfere(env):
    """Two episodes of the same task at once: separate uppers, separate grades."""
    from concurrent.futures import ThreadPoolExecutor
    task = env.tasks[2]
    patch = task.data["patch"]
    fix = [write_file("/tmp/fix.diff", patch), shell("git apply -R /tmp/fix.diff"), FINISH]
    noop = [shell("echo scratch > notes.txt"), FINISH]
    with ThreadPoolExecutor(2) as pool:
        fixed = pool.submit(run_episode, env, task, fix, "c-fix")
        untouched = pool.submit(run_episode, env, task, noop, "c-noop")
        assert fixed.result()[2] == 1.0
        assert untouched.result()[2] == 0.0


def test_grader_sandbox_killed_is_grader_error(env, coding_helper):
    """A grader sandbox killed from outside: no honest reward, GraderError."""
    import threading
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="grader-killed")
    try:
        episode.reset()
        assert episode.step(FINISH).done
        before = coding_helper.sandbox_inits()
        stop = threading.Event()

        def killer():
            # Every new child of the helper until grading gives up: the
            # grader's init is among them.
            while not stop.is_set():
                for pid in coding_helper.sandbox_inits() - before:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # already gone
                time.sleep(0.005)
        thread = threading.Thread(target=killer)
        thread.start()
        try:
            with pytest.raises(errors.GraderError) as info:
                episode.grade()
        finally:
            stop.set()
            thread.join()
        assert info.value.failure_class is FailureClass.GRADER_ERROR
    finally:
        episode.close()
