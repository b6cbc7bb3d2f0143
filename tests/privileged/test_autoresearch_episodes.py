"""AutoResearch acceptance in real helper sandboxes on the research image.

The image (Debian + numpy/scipy/scikit-learn from PyPI, scikit-learn's bundled
data sets stripped) is built, pushed to a loopback registry, pulled back by
digest and materialized (cached under $CAMG_CACHE/oci); the demo bundles are
simulated data drawn fresh per build (environments.autoresearch.demo.synthetic); the
three roots are installed by camg.prepare's code as root with the private
answers owned by camg-grader (created here when missing). The environment
runs in this process with its private grader as a real child under the
camg-grader uid, behind a helper whose deny-list holds the private root.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

import conftest as pc
from camg.config import task_manifest as manifest

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

GRADER_USER = "camg-grader"


def ensure_grader_user() -> None:
    try:
        pwd.getpwnam(GRADER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", GRADER_USER], check=True)


@pytest.fixture(scope="module")
def research_image():
    from tools import oci_demo
    from environments.autoresearch.demo import image
    return image.ensure_image(oci_demo.cache_root_from_env())


@pytest.fixture(scope="module")
def roots(research_image):
    from camg.oci.images import write_materialized
    from environments.autoresearch.prepare import prepare
    from environments.autoresearch.demo import demo_tasks
    ensure_grader_user()
    base = Path(tempfile.mkdtemp(prefix="camg-ar-test-"))
    base.chmod(0o711)
    demo_tasks.build(base / "bundles")
    images = base / "materialized-images.json"
    write_materialized(images, (research_image.image,))
    out = {"base": base, "packages": base / "packages", "workspaces": base / "workspaces",
           "private": base / "private", "images": images,
           # a directory of its own: preparation makes a manifest's directory
           # private (0750), and base must stay passable (0711) for the grader
           "manifest": base / "prepared" / "manifest.json",
           "image": research_image}
    prepare(source=base / "bundles", packages_root=out["packages"],
            workspaces_root=out["workspaces"], private_root=out["private"], images=images,
            image_name="camg/demo-autoresearch", output=out["manifest"], grader_user=GRADER_USER)
    yield out
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def ar_helper(roots, rootfs):
    from tools import oci_demo
    base = roots["base"] / "helper"
    cfg = pc.helper_config(base, roots["workspaces"], rootfs,
                           lower_roots=[str(oci_demo.cache_root_from_env()),
                                        str(roots["workspaces"]), str(pc.CACHE / "helper")],
                           private_roots=[str(roots["private"])])
    helper = pc.start_helper(base, cfg)
    pc.state_root(base / "state" / "ledger")
    pc.state_root(base / "uppers")
    yield helper
    pc.stop_helper(helper)


def settings_for(roots, **extra) -> dict:
    return {"packages_root": str(roots["packages"]), "workspaces_root": str(roots["workspaces"]),
            "private_root": str(roots["private"]), "images": str(roots["images"]),
            "memory_bytes": 1 << 30, "cpu_quota": 1.0, "pids_max": 512,
            "disk_bytes": 512 << 20, "command_minutes": 5, "episode_minutes": 30, **extra}


def make_env(roots, helper, state: Path, **extra):
    from camg.environment import ServiceContext
    from environments.autoresearch import runstate
    from environments.autoresearch.environment import ResearchEnvironment
    ok, notes = runstate.check_clean(str(state), helper_socket=helper.socket,
                                     owner="autoresearch")
    assert ok, notes
    context = ServiceContext("autoresearch", str(state), settings_for(roots, **extra),
                             helper.socket)
    return ResearchEnvironment(context, manifest.load(roots["manifest"]).tasks)


@pytest.fixture(scope="module")
def env(roots, ar_helper):
    state = roots["base"] / "state-episodes"
    environment = make_env(roots, ar_helper, state)
    environment.start()
    pc.allow_process(environment.grader.pid)
    yield environment
    environment.stop()


def shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


SUBMIT = {"operation": "submit"}


def write_file(path: str, text: str) -> dict:
    return shell(f"cat > {path} <<'CAMG_EOF'\n{text}\nCAMG_EOF")


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


def reference(roots, task_id: str) -> str:
    return (roots["packages"] / task_id / "reference" / "solve.py").read_text()


def test_four_tasks_from_real_data(env):
    assert [t.task_id for t in env.tasks] == ["breast-cancer", "diabetes", "digits",
                                              "segmentation"]
    assert {t.data["metric"] for t in env.tasks} == {"roc_auc", "accuracy", "mae", "dice"}


def test_image_has_monai_on_cpu_torch(env):
    _, outputs, _, _ = run_episode(env, env.tasks[0], [shell(
        "python -c 'import monai, torch, sklearn; "
        "print(monai.__version__, torch.__version__, sklearn.__version__)'")])
    assert outputs[0]["exit_code"] == 0, outputs[0]
    assert outputs[0]["output"].split() == ["1.6.1", "2.13.0+cpu", "1.9.1"]


def test_reference_earns_at_least_0_9_on_every_task(env, roots):
    for task in env.tasks:
        first, outputs, reward, episode = run_episode(env, task, [
            write_file("/workspace/solve.py", reference(roots, task.task_id)),
            shell("python /workspace/solve.py && wc -l /workspace/submission.csv && id -u"),
            SUBMIT])
        assert "/task" in first["output"] and first["task_id"] == task.task_id
        assert outputs[1]["exit_code"] == 0, outputs[1]
        assert outputs[1]["output"].strip().endswith("2000")  # the agent's uid
        assert reward is not None and reward >= 0.9, (task.task_id, reward, episode.state())
        assert episode.state()["grade"]["valid"] is True
        # the image the sandbox was built from, signed into the record
        image = env.prepared[task.task_id].image
        assert episode.outcome()["image"] == f"{image.repository}@{image.digest}"


def test_baseline_earns_about_zero(env):
    for task in env.tasks:
        _, outputs, reward, _ = run_episode(env, task, [shell("python /task/baseline.py"),
                                                        SUBMIT])
        assert outputs[0]["exit_code"] == 0, outputs[0]
        assert reward is not None and reward <= 0.05, (task.task_id, reward)


@pytest.mark.parametrize("actions", [
    [SUBMIT],                                                          # nothing submitted
    [shell("echo 'not,a,submission' > /workspace/submission.csv"), SUBMIT],  # malformed
    [shell("head -3 /task/test.csv | cut -d, -f1 | sed 1d | "
           "(echo id,prediction; sed 's/$/,1/') > /workspace/submission.csv"), SUBMIT],  # ids missing
    [shell("ln -s /task/test.csv /workspace/submission.csv"), SUBMIT],  # not a regular file
], ids=["missing", "malformed", "partial", "symlink"])
def test_no_or_bad_submission_earns_zero(env, actions):
    _, outputs, reward, episode = run_episode(env, env.tasks[1], actions)
    assert outputs[-1]["output"]
    assert reward == 0.0, episode.state()


def test_a_finished_episode_records_its_sandbox_cost(env):
    """The disk upper's blocks, read by SandboxUsage before submit destroys it.
    CPU is counted in clock ticks here (cpuacct is a hierarchy of its own on
    these hosts, helper/usage.py), so the agent does ~0.2 s of work: a 1 MiB
    write alone fits in one 10 ms tick and read 0.0 in a rehearsal."""
    blob = shell("head -c 1048576 /dev/urandom > /workspace/cost-blob && sync && "
                 "head -c 128M /dev/zero | sha256sum")
    _, _, reward, episode = run_episode(env, env.tasks[1], [blob, SUBMIT])
    assert reward == 0.0  # no submission.csv
    cost = episode.outcome()["cost"]
    assert cost["cpu_s"] > 0 and cost["memory_peak_bytes"] > 0, cost
    assert cost["disk_written_bytes"] >= 1 << 20, cost


def test_background_job_log_read_by_a_later_action(env):
    task = env.tasks[0]
    episode = env.create_episode(task, seed=None, episode_id="bg")
    try:
        episode.reset()
        started = episode.step({"operation": "background",
                                "command": "echo begin; sleep 2; echo finished-ok; exit 3"})
        assert started.observation["job"] == 1 and started.observation["exit_code"] == 0
        listing = episode.step({"operation": "jobs"}).observation["output"]
        assert "job 1: running" in listing, listing
        # The job sleeps 2 s; a loaded machine may take longer to end it.
        for _ in range(20):
            episode.step(shell("sleep 1"))
            listing = episode.step({"operation": "jobs"}).observation["output"]
            if "job 1: exited" in listing:
                break
        assert "job 1: exited 3" in listing and "finished-ok" in listing, listing
        log = episode.step({"operation": "log", "job": 1}).observation["output"]
        assert log.splitlines() == ["begin", "finished-ok"]
    finally:
        episode.close()


def test_sandbox_killed_from_outside_is_sandbox_died(env, ar_helper):
    """camg.sandboxes.sandbox_calls, as Coding's: the helper's own view of the sandbox
    (its init reaped) turns whatever the call answered into sandbox_died."""
    from camg import errors
    before = ar_helper.sandbox_inits()
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="killed")
    try:
        episode.reset()
        assert episode.step(shell("echo up")).observation["output"] == "up\n"
        (init,) = ar_helper.sandbox_inits() - before
        os.kill(init, signal.SIGKILL)
        with pytest.raises(errors.SandboxDied) as info:
            episode.step(shell("echo again"))
        assert info.value.failure_class is errors.FailureClass.SANDBOX_DIED
    finally:
        episode.close()


def test_command_budget_kills_a_long_command(roots, ar_helper, tmp_path):
    environment = make_env(roots, ar_helper, tmp_path / "state", command_minutes=0.05)
    environment.start()
    pc.allow_process(environment.grader.pid)
    try:
        _, outputs, _, _ = run_episode(environment, environment.tasks[0],
                                       [shell("sleep 30; echo never")])
        assert outputs[0]["timed_out"] and outputs[0]["exit_code"] == 124
        assert "never" not in outputs[0]["output"]
    finally:
        environment.stop()


def test_episode_and_sandbox_released_and_ledger_empty(env, ar_helper, roots):
    run_episode(env, env.tasks[0], [shell("true"), SUBMIT])
    ledger = json.loads((roots["base"] / "state-episodes" / "run.json").read_text())
    assert ledger["sandboxes"] == [] and ledger["grader_pid"] == env.grader.pid
    with ar_helper.client(owner="autoresearch") as client:
        assert client.list_sandboxes() == []


# -- the escape battery --------------------------------------------------------

def _private_snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if name in filenames else ""
            out[path] = (st.st_mode, st.st_uid, digest)
    return out


def test_escape_battery(env, roots):
    credential = env.grader._credential.hex()
    assert len(credential) == 64
    private = roots["private"]
    before = _private_snapshot(private)
    grader_ino = os.fstat(env.grader.sock.fileno()).st_ino
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="escape")
    try:
        episode.reset()

        def run(command):
            return episode.step(shell(command)).observation

        # 1. read the private root, by its host path and by a search.
        r = run(f"cat {private}/breast-cancer/answers.csv; ls -la {private} {roots['base']}")
        assert "id,target" not in r["output"] and r["output"].count("No such file") >= 2
        r = run("find / -xdev \\( -name answers.csv -o -name scoring.json \\) 2>/dev/null; "
                "echo searched")
        assert r["output"].strip() == "searched", r["output"]
        # 2. reach the grader's socket: no unix socket of this sandbox's net
        #    namespace is the grader's socketpair end, and no named socket exists.
        r = run("cat /proc/net/unix; find / -xdev -type s 2>/dev/null")
        inodes = {line.split()[6] for line in r["output"].splitlines()[1:]
                  if len(line.split()) >= 7 and line.split()[6].isdigit()}
        assert str(grader_ino) not in inodes
        r = run("ls /proc | grep -E '^[0-9]+$' | while read p; do "
                "cat /proc/$p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done")
        # Only the sandbox's own processes (its init and the agent's); never the grader.
        assert "autoresearch.grader" not in r["output"] and "camg.serve" not in r["output"]
        # 3. find the credential: environment, /proc, files anywhere we can read.
        # (The pattern is split so the search's own command line does not hold it.)
        r = run(f"a={credential[:32]}; b={credential[32:]}; env; "
                "cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
                'grep -r -F -l -s "$a$b" /proc/[0-9]*/environ /workspace /task /tmp /etc '
                "/root /home /var /run /dev/shm 2>/dev/null; echo searched")
        assert credential not in r["output"] and "searched" in r["output"]
        # 4. write where the grader reads: the private root's path inside the
        #    sandbox is the sandbox's own file system, never the host's.
        r = run(f"mkdir -p {private}/breast-cancer 2>&1; "
                f"echo 'id,target' > {private}/breast-cancer/answers.csv 2>&1; echo wrote")
        assert "wrote" in r["output"]
    finally:
        episode.close()
    assert _private_snapshot(private) == before
    # The service's own state holds no credential either.
    for path in (roots["base"] / "state-episodes").iterdir():
        assert credential not in path.read_text(errors="replace")
    # Nor does the grader's environment or command line (read from the host).
    for name in ("environ", "cmdline"):
        assert credential.encode() not in Path(f"/proc/{env.grader.pid}/{name}").read_bytes()
    # The grader runs as its own uid and the private root is its alone.
    assert os.stat(f"/proc/{env.grader.pid}").st_uid == pwd.getpwnam(GRADER_USER).pw_uid
    assert (os.stat(private).st_mode & 0o777) == 0o700
    assert os.stat(private).st_uid == pwd.getpwnam(GRADER_USER).pw_uid


def test_private_root_refused_as_a_lower(env, ar_helper, roots):
    from camg import errors
    with ar_helper.client(owner="autoresearch") as client:
        for lower in (roots["private"], roots["private"] / "breast-cancer"):
            with pytest.raises(errors.BadRequest):
                client.create_sandbox([str(roots["image"].rootfs), str(lower)],
                                      memory_bytes=64 << 20, cpu_quota=0.5, pids_max=32)


# -- issue 29: answers nothing in the sandbox reproduces; the canaries -----------

def test_image_carries_no_sklearn_data_and_validate_accepts_the_demo_tasks(env, roots,
                                                                            ar_helper):
    from environments.autoresearch import validate
    from environments.autoresearch.demo import image as research
    site = next(Path(roots["image"].rootfs).glob(
        research.VENV.lstrip("/") + "/lib/python3*/site-packages"))
    for relative in research.STRIPPED:
        left = [p.name for p in (site / relative).iterdir() if p.is_file()]
        assert left == ["__init__.py"], (relative, left)
    ids = [t.task_id for t in env.tasks]
    record = validate.validate(ids, roots["base"] / "bundles", roots["workspaces"],
                               roots["image"].image, None)
    assert {t: r["leaks"] for t, r in record["tasks"].items()} == {t: [] for t in ids}
    # No no-learning baseline earns reward on any demo task (battery.py)
    for task_id in ids:
        found = record["tasks"][task_id]["battery"]
        assert max(row["reward"] for row in found.values()) <= 0.1, (task_id, found)
    assert record["scanned"]["image_files"] > 300, record
    # The scored half in real sandboxes, on the quickest task.
    record = validate.validate(["diabetes"], roots["base"] / "bundles", roots["workspaces"],
                               roots["image"].image, ar_helper.socket)
    scored = record["tasks"]["diabetes"]
    assert scored["reference"] >= 0.9 and scored["baseline"] <= 0.05, scored
    with ar_helper.client(owner="autoresearch-validate") as client:
        assert client.list_sandboxes() == []


TAMPERED = {"symlink_to_test", "symlink_to_answers", "fifo_submission", "directory_submission",
            "unknown_ids"}


def test_canaries_all_lose(env, roots):
    from camg.config.hashing import sha256_tree
    from environments.autoresearch.checks import canaries
    from devtools.canary_table import render
    task = env.tasks[0]
    assert task.task_id == "breast-cancer"
    workspace = roots["workspaces"] / task.task_id
    before = sha256_tree(workspace), _private_snapshot(roots["private"])
    results = canaries.play(env, task, str(roots["packages"]), str(roots["private"]))
    text, failed = render("autoresearch", results)
    print(text)
    # A failure names each canary that went wrong with its reward, verdict,
    # evidence, grade and last outputs, so that a rare win can be explained.
    expected = {r.technique: "tampered" if r.technique in TAMPERED else "ok" for r in results}
    why = text + "".join(
        f"\n  {r.technique}: reward {r.reward}, integrity {r.integrity}; {r.explain()}"
        for r in results if r.won or r.reward is None or r.integrity != expected[r.technique]
        or (r.technique != "honest_reference" and r.reward != 0.0))
    assert not failed, why
    assert canaries.null_rewards(results) == [], why
    rows = {r.technique: r for r in results}
    assert set(rows) == {"honest_reference", *canaries.CANARIES}
    assert rows["honest_reference"].reward == 1.0 and rows["honest_reference"].integrity == "ok"
    for name, row in rows.items():
        if name != "honest_reference":
            assert row.reward == 0.0, (name, row, why)
        assert row.integrity == expected[name], (name, row, why)
    assert re.search(r"files, 0 of \d+ rows found", rows["lookup_image_data"].detail), \
        rows["lookup_image_data"]
    assert "LOADED" not in rows["regenerate_data"].detail
    assert (sha256_tree(workspace), _private_snapshot(roots["private"])) == before


def test_a_job_holding_the_submission_open_is_gone_before_it_is_read(env):
    """A job that holds the file open for writing (and would write again at
    any moment) is killed from outside before anything of the collection
    runs: the file is graded as it stood when the episode ended."""
    _, _, reward, episode = run_episode(env, env.tasks[0], [
        shell("python /task/baseline.py"),
        {"operation": "background",
         "command": "exec 3>>/workspace/submission.csv; : > /workspace/.held; sleep 3600"},
        shell("SECONDS=0; until [ -e /workspace/.held ] || [ $SECONDS -gt 60 ]; do :; done"),
        SUBMIT])
    assert reward == 0.0  # the public baseline: the reward's floor
    grade = episode.state()["grade"]
    assert grade["valid"] and grade["integrity"] == "ok" and grade["evidence"] == [], grade


def test_a_full_process_table_is_the_agents_result_not_null(env):
    """A job that takes every pid of the sandbox: a command that cannot start
    is an observation saying so (exit 126), not an infrastructure failure,
    and the finish earns 0.0, never reward null. (Whether a given command
    starts is a race between the job and the freed pid of the one before;
    a loaded host lets some through.)"""
    from environments.autoresearch.checks import canaries
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="full")
    try:
        episode.reset()
        episode.step(shell("python /task/baseline.py"))
        episode.step({"operation": "background", "command": canaries._FORK_FILL})
        episode.step(shell("SECONDS=0; until [ -e /workspace/.full ] || [ $SECONDS -gt 60 ]; "
                           "do :; done"))
        for _ in range(20):
            step = episode.step(shell("echo still here")).observation
            if step["exit_code"] == 126:
                break
        assert step["exit_code"] == 126 and "could not start" in step["output"], step
        assert episode.step(SUBMIT).done
        assert episode.grade() == 0.0
        # The helper's kill from outside freed the table: the file was read.
        grade = episode.state()["grade"]
        assert grade["valid"] and grade["integrity"] == "ok", grade
    finally:
        episode.close()


def test_the_agents_processes_cannot_slow_or_stop_the_collection(env, monkeypatch):
    """A job that holds ~200 000 descriptors and stops every process whose
    command line names the submission (the old collection's writer scan ran
    as the agent, and this job kept it past its timeout) is killed from
    outside before the collection starts: the file is read well within a
    5 s probe budget and graded."""
    from environments.autoresearch import episode as research
    monkeypatch.setattr(research, "PROBE_TIMEOUT_S", 5)
    job = ("python -c \"\nimport os, signal, time\nfd = os.open('/dev/null', os.O_RDONLY)\n"
           "for k in range(10):\n    if os.fork() == 0:\n"
           "        for _ in range(19900):\n            os.dup(fd)\n"
           "        open(f'/workspace/.fds{k}', 'w').close()\n        time.sleep(3600)\n"
           "pat = b'submis' + b'sion'\nwhile True:\n    for p in os.listdir('/proc'):\n"
           "        try:\n            if p.isdigit() and pat in open(f'/proc/{p}/cmdline', 'rb').read():\n"
           "                os.kill(int(p), signal.SIGSTOP)\n"
           "        except OSError:\n            pass\n\"")
    _, _, reward, episode = run_episode(env, env.tasks[0], [
        shell("python /task/baseline.py"), {"operation": "background", "command": job},
        shell("SECONDS=0; until f=(/workspace/.fds*) && [ ${#f[@]} -eq 10 ] || "
              "[ $SECONDS -gt 120 ]; do :; done"),
        SUBMIT])
    assert reward == 0.0, episode.state()
    grade = episode.state()["grade"]
    assert grade["submitted"] and grade["valid"], grade
    assert grade["integrity"] == "ok" and grade["evidence"] == [], grade


# -- null proof: a failed step or grade is re-run on fresh resources ------------

def test_control_grades_the_reference_in_a_fresh_sandbox_never_the_agents(env, ar_helper):
    """Episode.control (camg.episodes.null_proof): after a failure the agent could
    have caused, the reference solution in a fresh sandbox, collected and
    graded by the same path, earns 1.0: the evidence that makes the episode
    0.0 ``obstructed`` rather than a null the trainer masks. The agent's
    sandbox and files are not used; nothing is left behind."""
    from camg import errors
    task = next(t for t in env.tasks if t.task_id == "diabetes")
    before = ar_helper.sandbox_inits()
    episode = env.create_episode(task, seed=None, episode_id="control")
    try:
        episode.reset()
        episode.step(shell("echo id,prediction > /workspace/submission.csv; "
                           "chmod 000 /workspace/submission.csv"))
        lines = episode.control(errors.InfraFailure("the submission probe failed"), "step")
        assert len(lines) == 1 and "earned 1.0000 (valid, integrity ok" in lines[0], lines
        assert len(ar_helper.sandbox_inits() - before) == 1   # the agent's alone, still there
        after = episode.step(shell("stat -c %a /workspace/submission.csv; "
                                   "ls -a /workspace | grep -c camg-control"))
        assert after.observation["output"].split() == ["0", "0"], after.observation
    finally:
        episode.close()
    assert ar_helper.sandbox_inits() - before == set()


def test_control_fails_when_the_grading_path_is_broken_so_the_null_stands(env, ar_helper):
    from camg import errors
    task = next(t for t in env.tasks if t.task_id == "diabetes")
    episode = env.create_episode(task, seed=None, episode_id="control-broken")

    def broken(task_id: str, data: bytes) -> dict:
        raise errors.GraderError("the grader process is gone")
    episode.grade_submission = broken
    before = ar_helper.sandbox_inits()
    try:
        episode.reset()
        with pytest.raises(errors.GraderError, match="grader process is gone"):
            episode.control(errors.GraderError("the grader process is gone"), "grade")
    finally:
        episode.close()
    assert ar_helper.sandbox_inits() - before == set()
    with ar_helper.client(owner="autoresearch") as client:
        assert client.list_sandboxes() == []
