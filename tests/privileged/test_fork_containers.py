"""Forking container episodes (issue 26): the helper's ContainerFork on a real
dockerd, then General and Visual episodes forked in process (the
environments' Episode.fork, as the episode manager calls it) with their
real containers, transports, renderer and local judges.

Asserted: the child has the parent's files and the parent's parameters,
labels and limits, whiteouts and opaque directories included; writes are
isolated both ways; each on its own bounded ext4; the next fork takes a
standby child (helper/container_standby.py) and no image is made; another
peer cannot fork a container; capacity is checked before any work; agent
processes are refused by name; parents closed before children and children
before parents; no container, standby or image is left afterwards; on each environment the
oracle on one branch earns the maximum and a no-op on the other 0; an
attempt on the grade made before a General fork still zeroes the child.
Timings are bench/bench_fork_containers.py's, not asserted here.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from camg import errors
from camg.config import task_manifest
from camg.sandboxes.containers import ContainerClient
from camg.environment import ServiceContext, Task
from tests.privileged.container_fixtures import (container_helper, image_ref, needs_docker,  # noqa: F401
                                                 spec)
from tests.support import container_image as ci
from test_visual_episodes import judge, mirror_manifest, renderer_dir, visual_helper  # noqa: F401
from general_fixtures import KEY, tasks_of

pytestmark = [pytest.mark.privileged, pytest.mark.slow, pytest.mark.docker, needs_docker]

OWNER = f"fork-t{os.getpid()}"


def fork_images(owner: str) -> set[str]:
    api = ci.docker_api()
    try:
        return {i["Id"] for i in api.images(all=True, filters={
            "label": ["camg.fork=1", f"camg.service={owner}"]})}
    finally:
        api.close()


def inspect(cid: str) -> dict:
    api = ci.docker_api()
    try:
        return api.inspect_container(cid)
    finally:
        api.close()


@pytest.fixture
def fc(container_helper):  # noqa: F811
    c = ContainerClient(container_helper.socket, owner=OWNER)
    yield c
    left = c.list()
    c.release_all()
    c.close()
    assert left == [], f"the test left containers behind: {left}"
    assert fork_images(OWNER) == set(), "snapshot images left behind"
    assert labelled(OWNER) == set(), "standby children left behind"


def sh(c: ContainerClient, cid: str, command: str, user: str = "root") -> str:
    r = c.exec(cid, command, user=user)
    assert r.exit_code == 0, r.output
    return r.output


# -- the helper's verb -------------------------------------------------------------------

def labelled(owner: str) -> set[str]:
    """Every container of this owner in dockerd, standbys included."""
    api = ci.docker_api()
    try:
        return {c["Id"] for c in api.containers(all=True, filters={"label": [f"camg.service={owner}"]})}
    finally:
        api.close()


def layer_mount(cid: str) -> tuple[str, str, str]:
    """(mount point, fstype, source) of the container's overlay2 layer directory."""
    layer = os.path.dirname(inspect(cid)["GraphDriver"]["Data"]["UpperDir"])
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] == layer:
                rest = fields[fields.index("-") + 1:]
                return layer, rest[0], rest[1]
    return layer, "", ""


def wait_standbys(c: ContainerClient, owner: str, want: int, timeout: float = 120.0) -> set[str]:
    """The refill is in the background: until dockerd holds ``want`` more than the peer lists."""
    deadline = time.monotonic() + timeout
    while True:
        extra = labelled(owner) - {x["container_id"] for x in c.list()}
        if len(extra) >= want or time.monotonic() > deadline:
            return extra
        time.sleep(0.2)


def test_fork_carries_files_and_config_isolated_both_ways(fc, image_ref):  # noqa: F811
    parent = fc.create(spec(image_ref, command=("sleep", "infinity"), user="agent"), episode_id="p-1")
    sh(fc, parent.id, "echo before > /tmp/f")
    # a whiteout and an opaque directory over the image's files: carried as such
    sh(fc, parent.id, "rm /etc/debian_version && rm -rf /etc/apt && mkdir /etc/apt && touch /etc/apt/new")
    r = fc.fork_reply(parent.id, episode_id="c-1")
    child = r["container_id"]
    assert r["image"] == image_ref and r["depth"] == 1 and r["snapshot"] == ""
    assert r["standby"] is False  # the first fork of its spec
    assert fork_images(OWNER) == set()  # no image is made
    assert sh(fc, child, "cat /tmp/f") == "before\n"
    assert sh(fc, child, "test -e /etc/debian_version || echo absent; ls -A /etc/apt") == "absent\nnew\n"
    sh(fc, child, "echo child > /tmp/c")
    sh(fc, parent.id, "echo parent > /tmp/p")
    assert sh(fc, parent.id, "test -e /tmp/c || echo absent") == "absent\n"
    assert sh(fc, child, "test -e /tmp/p || echo absent") == "absent\n"
    p, c = inspect(parent.id), inspect(child)
    assert c["Image"] == p["Image"]  # the manifest image, by its id
    assert not p["State"]["Paused"] and p["State"]["Running"]
    for key in ("NanoCpus", "Memory", "MemorySwap", "PidsLimit", "NetworkMode", "CapDrop", "CapAdd",
                "SecurityOpt", "Init", "Privileged", "Binds", "Devices", "IpcMode", "LogConfig"):
        assert c["HostConfig"][key] == p["HostConfig"][key], key
    for key in ("User", "Cmd", "Env", "WorkingDir"):
        assert c["Config"][key] == p["Config"][key], key
    assert c["HostConfig"]["NetworkMode"] == "none" and c["Config"]["User"] == p["Config"]["User"]
    labels = {k: v for k, v in c["Config"]["Labels"].items() if k.startswith("camg.")}
    want = {k: v for k, v in p["Config"]["Labels"].items() if k.startswith("camg.")}
    assert labels == {**want, "camg.episode": "c-1", "camg.pool": "0", "camg.fork": "1"}
    assert sh(fc, child, "id -u", user="agent").strip() == "2000"
    # each on a bounded ext4 of its own
    (pl, pfs, psrc), (cl, cfs, csrc) = layer_mount(parent.id), layer_mount(child)
    assert pfs == cfs == "ext4" and psrc.startswith("/dev/loop") and csrc.startswith("/dev/loop")
    assert psrc != csrc
    # the next fork of the spec takes a standby made meanwhile: its labels were fixed without an episode
    standbys = wait_standbys(fc, OWNER, 2)
    assert len(standbys) == 2 and all(not inspect(s)["State"]["Running"] for s in standbys)
    r2 = fc.fork_reply(parent.id, episode_id="c-2")
    assert r2["standby"] is True and r2["container_id"] in standbys
    assert sh(fc, r2["container_id"], "cat /tmp/f /tmp/p; test -e /tmp/c || echo absent") == \
        "before\nparent\nabsent\n"
    c2 = inspect(r2["container_id"])
    assert {k: v for k, v in c2["Config"]["Labels"].items() if k.startswith("camg.")} == \
        {**want, "camg.episode": "", "camg.pool": "0", "camg.fork": "1"}
    assert {x["container_id"] for x in fc.list()} == {parent.id, child, r2["container_id"]}
    assert fc.remove(r2["container_id"]) is True
    # the parent goes first; the child keeps its files
    assert fc.remove(parent.id) is True
    assert sh(fc, child, "cat /tmp/f /tmp/c") == "before\nchild\n"
    assert labelled(OWNER) - {child} != set()  # standbys stay while a container of the spec does
    assert fc.remove(child) is True and fc.remove(child) is False  # idempotent
    assert labelled(OWNER) == set() and fork_images(OWNER) == set()
    assert not os.path.ismount(cl) and not os.path.ismount(pl)


def test_a_peer_cannot_fork_another_peers_container(fc, container_helper, image_ref):  # noqa: F811
    parent = fc.create(spec(image_ref, command=("sleep", "infinity")))
    other = ContainerClient(container_helper.socket, owner=OWNER + "-other")
    try:
        with pytest.raises(errors.NotFound):
            other.fork(parent.id)
        with pytest.raises(errors.NotFound):
            fc.fork("0" * 64)
        with pytest.raises(errors.BadRequest):
            fc.fork("not-an-id")
        assert other.list() == [] and labelled(OWNER + "-other") == set()
        assert not inspect(parent.id)["State"]["Paused"]
    finally:
        other.close()
        fc.remove(parent.id)
    assert fork_images(OWNER) == set() and fork_images(OWNER + "-other") == set()


def test_fork_chain_child_closed_before_parent(fc, image_ref):  # noqa: F811
    parent = fc.create(spec(image_ref, command=("sleep", "infinity")))
    sh(fc, parent.id, "echo 0 > /tmp/gen")
    first = fc.fork_reply(parent.id, episode_id="g1")
    sh(fc, first["container_id"], "echo 1 >> /tmp/gen && rm /etc/debian_version")
    second = fc.fork_reply(first["container_id"], episode_id="g2")  # a fork of a fork
    assert second["depth"] == 2
    assert sh(fc, second["container_id"], "cat /tmp/gen; test -e /etc/debian_version || echo absent") == \
        "0\n1\nabsent\n"
    # the middle one first: the grandchild holds no reference to it
    fc.remove(first["container_id"])
    assert sh(fc, second["container_id"], "cat /tmp/gen") == "0\n1\n"
    fc.remove(second["container_id"])
    assert sh(fc, parent.id, "cat /tmp/gen; cat /etc/debian_version >/dev/null && echo kept") == "0\nkept\n"
    fc.remove(parent.id)
    assert fork_images(OWNER) == set() and labelled(OWNER) == set()


def test_agent_processes_are_refused_and_capacity_checked_first(fc, image_ref):  # noqa: F811
    parent = fc.create(spec(image_ref, command=("sleep", "infinity")))
    sh(fc, parent.id, "sleep 600 >/dev/null 2>&1 & echo $! > /tmp/bg", user="agent")
    with pytest.raises(errors.NotForkable) as info:
        fc.fork(parent.id)
    assert info.value.details["what"] == "agent_processes"
    assert labelled(OWNER) == {parent.id} and not inspect(parent.id)["State"]["Paused"]
    # gone, not just signalled: a process still exiting is a live one to the helper
    sh(fc, parent.id, "bg=$(cat /tmp/bg); kill -9 $bg; "
                      "for _ in $(seq 200); do kill -0 $bg 2>/dev/null || break; sleep 0.05; done")
    # the helper's per-peer ceiling (8 in container_fixtures), standbys not counted: refused before any work
    children = [fc.fork(parent.id) for _ in range(7)]
    assert len(fc.list()) == 8
    with pytest.raises(errors.AtCapacity):
        fc.fork(parent.id)
    assert len(fc.list()) == 8 and not inspect(parent.id)["State"]["Paused"]
    assert fc.release_all() == 8  # the standbys go too, uncounted: the peer never had them
    assert labelled(OWNER) == set() and fork_images(OWNER) == set() and children


# -- Visual ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def visual_env(tmp_path_factory, image_ref, renderer_dir, mirror_manifest, visual_helper,  # noqa: F811
               judge):  # noqa: F811
    from environments.visual.environment import VisualEnvironment
    from environments.visual.prepare import prepare_visual
    from environments.visual.demo import demo_tasks

    tmp = tmp_path_factory.mktemp("visual-fork")
    rows = demo_tasks.build(tmp / "demo")
    prepare_visual(rows_path=rows, renderer=renderer_dir, cdn_mirror=mirror_manifest,
                   output=tmp / "visual-manifest.json", image=image_ref,
                   references=tmp / "demo" / "reference")
    manifest = task_manifest.load(tmp / "visual-manifest.json")
    files = {k: {**v, "path": str(tmp / v["path"]) if not os.path.isabs(v["path"]) else v["path"]}
             for k, v in manifest.files.items()}
    settings = {"memory_bytes": 256 << 20, "cpu": 0.5, "pids_max": 256, "pool_size": 0,
                "render_timeout": 240, "render_memory_bytes": 1 << 30, "judge_backoff_s": 0.0,
                "judge_attempts": 2, "helper_owner": OWNER + "-visual"}
    env = VisualEnvironment(ServiceContext("visual", str(tmp / "state"), settings,
                                           helper_socket=visual_helper.socket, verified_files=files),
                            list(manifest.tasks))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"WD_JUDGE_URL": judge.url, "WD_JUDGE_MODEL": "fake-vision",
                           "WD_JUDGE_KEY": "sk-visual-test"}.items():
            mp.setenv(key, value)
        env.start()
    try:
        yield env
    finally:
        env.stop()
        left = ContainerClient(visual_helper.socket, owner=OWNER + "-visual")
        try:
            assert left.list() == []
        finally:
            left.close()
        assert fork_images(OWNER + "-visual") == set()


def shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


def play(episode, actions):
    """Step until done; the reward (grading when the step leaves it to grade())."""
    for action in actions:
        step = episode.step(action)
        if step.done:
            return step.reward if step.graded else episode.grade()
    raise AssertionError("the actions never finished the episode")


def test_visual_oracle_branch_earns_the_maximum_and_noop_zero(visual_env):
    from environments.visual import reference
    from tools.judge_stub import MAX_SCORE

    # plain CSS (test_oracle_visual's second task): the stub judge's maximum
    task = next(t for t in visual_env.tasks if t.task_id == "camg_webdev_demo_003")
    parent = visual_env.create_episode(task, seed=None, episode_id="vis-parent")
    child = None
    try:
        parent.reset()
        assert parent.step(shell("echo pre-fork > pre.txt")).observation["exit_code"] == 0
        child = parent.fork("vis-child")
        assert child.steps == parent.steps == 1
        assert child.step(shell("cat pre.txt")).observation["output"] == "pre-fork\n"
        child.step(shell("echo child > child.txt"))
        parent.step(shell("echo parent > parent.txt"))
        assert parent.step(shell("test -e child.txt || echo absent")).observation["output"] == "absent\n"
        assert child.step(shell("test -e parent.txt || echo absent")).observation["output"] == "absent\n"
        plan = reference.plan(task.task_id, task.data, cwd=child.cwd,
                              max_command_chars=child.settings.max_command_chars)
        assert play(child, plan) == MAX_SCORE
        assert child.outcome()["integrity"] == "ok"
        child.close()  # the child before its parent
        assert play(parent, [{"operation": "finish"}]) == 0.0
    finally:
        for ep in (child, parent):
            if ep is not None:
                ep.close()
    assert fork_images(OWNER + "-visual") == set()


def test_visual_parent_closed_before_child(visual_env):
    task = visual_env.tasks[0]
    parent = visual_env.create_episode(task, seed=None, episode_id="vis-p2")
    child = None
    try:
        parent.reset()
        parent.step(shell("mkdir -p dist && echo '<!DOCTYPE html><p>x' > dist/index.html"))
        child = parent.fork("vis-c2")
        parent.close()
        out = child.step(shell("cat dist/index.html")).observation
        assert out["exit_code"] == 0 and "<p>x" in out["output"]
    finally:
        for ep in (parent, child):
            if ep is not None:
                ep.close()
    assert fork_images(OWNER + "-visual") == set()


# -- General -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def general_env(general_demo, general_helper, general_prepared, tmp_path_factory):
    from environments.general.environment import GeneralEnvironment
    from tests.support.fake_judge import FakeJudge
    from tools.judge_stub import anchor_verdict

    tmp = tmp_path_factory.mktemp("general-fork")
    tasks = [Task(t["task_id"], t["data"]) for t in
             json.loads((general_prepared / "manifest.json").read_text())["tasks"]]
    owner = OWNER + "-general"
    with FakeJudge(responder=anchor_verdict) as fake:
        settings = {"pool_size": 0, "cpu": 0.5, "memory_bytes": 1 << 30, "pids_max": 256,
                    "connect_timeout_s": 300.0, "judge_timeout_s": 10.0, "judge_attempts": 2,
                    "judge_backoff_s": 0.05, "helper_owner": owner}
        env = GeneralEnvironment(ServiceContext("general", str(tmp), settings,
                                                helper_socket=general_helper.socket), tasks)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "anchor-judge",
                               "GA_JUDGE_KEY": KEY, "GA_JUDGE_API": "chat"}.items():
                mp.setenv(key, value)
            env.start()  # (the judge's configuration is read here)
        try:
            yield env
        finally:
            env.stop()
            left = ContainerClient(general_helper.socket, owner=owner)
            try:
                assert left.list() == []
            finally:
                left.close()
            assert fork_images(owner) == set()


def _task(env, prepared: Path, kind: str):
    wanted = tasks_of(prepared, kind)[0]["task_id"]
    return next(t for t in env.tasks if t.task_id == wanted)


def test_general_code_oracle_branch_one_noop_zero(general_env, general_demo, general_prepared):
    task = _task(general_env, general_prepared, "opensource-code")
    gold = (general_demo["out"] / "gold" / f"{task.task_id}.patch").read_text()
    data = base64.b64encode(gold.encode()).decode()
    parent = general_env.create_episode(task, seed=None, episode_id="gen-code-parent")
    child = None
    try:
        parent.reset()
        assert "before" in parent.step(shell("echo before | tee pre-fork.txt")).observation["output"]
        child = parent.fork("gen-code-child")
        assert child.steps == 1
        assert child.step(shell("cat pre-fork.txt")).observation["output"] == "before\n"
        child.step(shell("echo c > child-only.txt"))
        assert "absent" in parent.step(shell("test -e child-only.txt || echo absent")).observation["output"]
        parent.step(shell("echo p > parent-only.txt"))
        assert "absent" in child.step(shell("test -e parent-only.txt || echo absent")).observation["output"]
        # the parent goes first here; the child's verifier runs on its own files
        assert play(parent, [{"operation": "finish"}]) == 0.0
        parent.close()
        assert play(child, [shell(f"echo {data} | base64 -d | git apply && echo GOLD"),
                            {"operation": "finish"}]) == 1.0
        assert child.outcome()["integrity"] == "ok"
    finally:
        for ep in (parent, child):
            if ep is not None:
                ep.close()


def test_general_agent_fork_keeps_pre_fork_attempts(general_env, general_demo, general_prepared):
    task = _task(general_env, general_prepared, "general_agent")
    oracle = json.loads((general_demo["out"] / f"{task.task_id}.oracle.json").read_text())
    parent = general_env.create_episode(task, seed=None, episode_id="gen-ga-parent")
    clean = tainted = None
    try:
        parent.reset()
        clean = parent.fork("gen-ga-clean")
        # an attempt on the grade, then a fork: the child must not come out clean
        parent.step(shell("cat /opt/mimo-task/verifier_meta.json"))
        tainted = parent.fork("gen-ga-tainted")
        assert play(clean, oracle) == 1.0
        clean.close()  # a child before its parent
        assert play(tainted, oracle) == 0.0
        assert tainted.outcome()["integrity"] == "tampered"
        assert any(f["rule"] == "verifier_files" for f in tainted.outcome()["integrity_evidence"])
        # (the no-op branch's 0 is the code test's; the parent just closes)
    finally:
        for ep in (clean, tainted, parent):
            if ep is not None:
                ep.close()
