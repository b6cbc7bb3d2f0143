"""Coding on an image laid out like SWE-smith's (tools.oci_demo flavour "swesmith").

The image has the repository cloned at /testbed with its own history,
installed editable into /opt/miniconda3/envs/testbed, activated through
/opt/miniconda3/bin/activate + `conda activate testbed` (a stand-in for
conda's), and untracked build artifacts (bytecode) in the clone. The demo
tasks are served from it with SWE-smith's own Python test command,
unmodified; preparation validates every task (gold 1.0, no-op 0.0) in
sandboxes; the clone-masking path (opaque .git, whiteouts, artifacts
showing through) is checked from inside an episode; nothing the image
built from the clean sources (its bytecode) is visible to the agent on any
task (the leak check finds it on the image itself); tampering still earns
0.0.
"""

from __future__ import annotations

import json
import shlex

import pytest

from camg.config import task_manifest as manifest
from camg.environment import ServiceContext
from environments.coding import profiles
from environments.coding.checks import canaries
from test_coding_episodes import CACHE, FINISH, run_episode, shell
from test_coding_integrity_sandboxes import grade, reverse_gold, workspace_diff
from devtools.harness.auth import deployment_auth

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

ACTIVATE = "source /opt/miniconda3/bin/activate; conda activate testbed; "


@pytest.fixture(scope="module")
def swesmith_image(coding_helper):
    from tools import oci_demo as demo
    return demo.ensure_demo_image(demo.cache_root_from_env(), flavor="swesmith")


@pytest.fixture(scope="module")
def swesmith_prepared(swesmith_image, demo_set, coding_helper, tmp_path_factory):
    """The demo rows, served from the SWE-smith-shaped image, validated."""
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    from tools import oci_demo as demo
    from environments.coding.demo.swesmith_demo import rewrite_rows
    work = tmp_path_factory.mktemp("coding-swesmith")
    rows = rewrite_rows(demo_set / "tasks.jsonl", work / "rows.jsonl")
    images = work / "materialized-images.json"
    write_materialized(images, (swesmith_image.image,))
    out = work / "manifest.json"
    prepare_coding(rows_path=work / "rows.jsonl", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=out, layers_root=CACHE / "layers",
                   validate=True, helper_socket=coding_helper.socket)
    return {"manifest": out, "images": images, "mirrors": demo_set / "mirrors", "work": work,
            "rows": rows}


@pytest.fixture(scope="module")
def swesmith_env(swesmith_prepared, coding_helper):
    from environments.coding.environment import CodingEnvironment
    loaded = manifest.load(swesmith_prepared["manifest"])
    state = swesmith_prepared["work"] / "state"
    state.mkdir(exist_ok=True)
    context = ServiceContext("coding", str(state), {
        "mirrors_root": str(swesmith_prepared["mirrors"]),
        "images": str(swesmith_prepared["images"]),
        "layers_root": str(CACHE / "layers")}, coding_helper.socket)
    environment = CodingEnvironment(context, loaded.tasks)
    environment.start()
    yield environment
    environment.stop()


def test_image_is_laid_out_like_swesmith(swesmith_image):
    import subprocess
    root = swesmith_image.rootfs
    assert (root / "testbed/.git").is_dir()
    log = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(root / "testbed"), "log",
                          "--format=%s"], capture_output=True, text=True, check=True).stdout
    assert log.strip() == "apispec 6.8.1 from its sdist"
    assert (root / "opt/miniconda3/bin/activate").is_file()
    assert (root / "opt/miniconda3/envs/testbed/bin/pytest").is_file()
    site = root / "opt/miniconda3/envs/testbed/lib/python3.11/site-packages"
    assert list(site.glob("apispec-6.8.1.dist-info")), "not installed (editable)"
    assert list((root / "testbed/src/apispec").glob("__pycache__/*.pyc")), "no build artifacts"
    assert not (root / "opt/testbed-venv").exists()
    assert not any("testbed" in e for e in swesmith_image.image.env if e.startswith("PATH="))


def test_every_task_validated_gold_one_noop_zero(swesmith_prepared):
    # Validation also ran the leak check in each task's agent view: a finding
    # would be a "leaks" entry (and a refusal).
    body = manifest.load(swesmith_prepared["manifest"])
    validation = body.sampling["validation"]
    assert validation["validated"] == len(swesmith_prepared["rows"]) == len(body.tasks)
    assert all(r == {"gold": 1.0, "noop": 0.0} for r in validation["results"].values())


def test_profile_runs_swesmiths_command_unmodified(swesmith_env):
    task = swesmith_env.tasks[0]
    assert swesmith_env.prepared[task.task_id].profile.test_cmd == \
        profiles.SWESMITH_PYTHON_TEST_CMD


def test_workspace_is_the_task_repo_over_the_image_clone(swesmith_env):
    task = swesmith_env.tasks[0]
    row = swesmith_env.prepared[task.task_id].row
    hidden = sorted({t.split("::")[0] for t in row.fail_to_pass})
    checks = [
        shell("git log --format=%s | wc -l"),
        shell("git status --porcelain | wc -l"),
        shell(" ; ".join(f"test -e {shlex.quote(p)} && echo present-{i}"
                         for i, p in enumerate(hidden)) + " ; echo checked"),
        shell("ls src/apispec/__pycache__ 2>&1; find /testbed -name '*.pyc' | wc -l"),
        shell("command -v pytest || echo no-pytest-before-activation"),
        shell(ACTIVATE + "python -c 'import apispec, sys; print(apispec.__file__)'"),
        shell(ACTIVATE + "pytest --disable-warnings --color=no --tb=no --verbose "
              "tests/test_utils.py 2>&1 | tail -3"),
    ]
    _, out, _, _ = run_episode(swesmith_env, task, checks, episode_id="swesmith-ws")
    texts = [o["output"].strip() for o in out]
    assert texts[0] == "1", texts[0]                       # only the snapshot commit
    assert texts[1] == "0", texts[1]                       # artifacts do not show as changes
    assert "present-" not in texts[2] and texts[2].endswith("checked"), texts[2]
    # The image's bytecode (of the clean sources) is hidden.
    assert "No such file" in texts[3] and texts[3].endswith("\n0"), texts[3]
    assert "no-pytest-before-activation" in texts[4], texts[4]
    assert texts[5] == "/testbed/src/apispec/__init__.py", texts[5]
    assert " passed" in texts[6], texts[6]


def test_the_images_clean_bytecode_names_the_fixed_function(swesmith_env):
    """The leak as it was: the image's /testbed (built at the clean commit)
    with only the sources changed to the buggy ones, as the task layer used
    to leave it. The check must find the clean bytecode of every changed
    module and name the function the bug is in."""
    from environments.coding import leaks
    from environments.coding.episode import CodingEpisode
    real = swesmith_env.prepared[swesmith_env.tasks[0].task_id]
    clean = leaks.prepared_clean_sources(real)
    episode = CodingEpisode(swesmith_env.settings, swesmith_env.helper, real, "swesmith-leak")
    try:
        episode.sandbox = episode._create([real.image.rootfs])
        put = swesmith_env.helper.exec(episode.sandbox, "patch -s -p1", user="root", cwd="/testbed",
                                       stdin=real.row.patch.encode())
        assert put.exit_code == 0, put.output
        found, _ = leaks.sandbox_findings(swesmith_env.helper, episode.sandbox, clean)
    finally:
        episode.close()
    hits = {f.file for f in found if f.kind == "bytecode" and "/__pycache__/" in f.path}
    assert hits == {p for p in clean if p.endswith(".py")}, found
    assert all("clean code of" in f.detail for f in found if f.kind == "bytecode"), found


def test_gold_through_shell_actions_earns_one(swesmith_env):
    task = swesmith_env.tasks[1]
    patch = task.data["patch"]
    _, out, reward, episode = run_episode(
        swesmith_env, task, [shell(f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"), FINISH],
        episode_id="swesmith-gold")
    assert reward == 1.0, episode.state()


@pytest.mark.parametrize("technique", ["hook_registered_on_import", "os_exit_0_early",
                                       "forged_log_lines", "patch_pytest_on_import",
                                       "dist_info_entry_point_plugin",
                                       # round 3: tests rewritten under the runner,
                                       # a payload laundered through another file name
                                       "tests_rewritten_at_run_time",
                                       "code_compiled_under_false_name"])
def test_canary_with_gold_earns_zero(swesmith_env, technique):
    task = swesmith_env.tasks[0]
    row = swesmith_env.prepared[task.task_id].row

    def edit(work):
        reverse_gold(task)(work)
        canaries.apply(technique, work, row, package="apispec")
    reward, report, outcome = grade(swesmith_env, task, workspace_diff(swesmith_env, task, edit),
                                    f"swesmith-{technique}")
    assert reward == 0.0 and outcome["integrity"] == "tampered", report


def test_served_over_http_gold_one_noop_zero(swesmith_prepared, coding_helper, tmp_path):
    """The SWE-smith-shaped demo through camg.configure + `python -m camg.serve`."""
    import sys
    from camg_client import Client
    from camg.configure import configure
    from tests.support.services import ServiceProcess, clean_git_tree, free_port

    lock = tmp_path / "requirements.lock"
    lock.write_text("swebench==4.1.0\n")
    deployment = {
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
        "helper_socket": coding_helper.socket, "executables": {"python": sys.executable},
        "environments": {"coding": {
            "manifest": str(swesmith_prepared["manifest"]), "port": free_port(), "capacity": 2,
            "settings": {"mirrors_root": str(swesmith_prepared["mirrors"]),
                         "images": str(swesmith_prepared["images"]),
                         "layers_root": str(CACHE / "layers")}}},
    }
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp_path / "deployment.json", tmp_path / "prepared",
              source_tree=clean_git_tree(tmp_path / "src"))
    service = ServiceProcess(tmp_path / "prepared" / "coding.json")
    try:
        service.wait_ready(timeout=120)
        client = Client(service.url, timeout=600)
        task = manifest.load(swesmith_prepared["manifest"]).tasks[2]
        gold = client.create(task_id=task.task_id)
        patch = task.data["patch"]
        client.step(gold["episode_id"], {"operation": "shell", "command":
                    f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"})
        done = client.step(gold["episode_id"], {"operation": "finish"})
        assert done["reward"] == 1.0, done
        noop = client.create(task_id=task.task_id)
        done = client.step(noop["episode_id"], {"operation": "finish"})
        assert done["reward"] == 0.0 and done.get("failure_class") is None, done
        outcomes = service.outcomes()
        assert [(o["reward"], o["integrity"]) for o in outcomes] == [(1.0, "ok"), (0.0, "ok")]
    finally:
        assert service.stop() == 0, service.output()[-3000:]
