"""The reference solutions of AutoResearch, General and Visual (what
``python -m camg_client --policy oracle`` plays), without root: the action plans
decode back to exactly the prepared reference, follow the episode's step
count, fit the command limits, and a task prepared without one says so
(404 not_found), never guesses. The privileged tests/privileged/test_oracle_*.py
play them through real services."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tarfile
import types

import pytest

from camg.errors import DatasetError, NotFound


def _payload(actions: list[dict], store: str) -> bytes:
    """The bytes the plan's chunk actions append to ``store``."""
    chunks = [re.fullmatch(rf"printf %s '([A-Za-z0-9+/=]*)' >> {re.escape(store)}",
                           a["command"]).group(1) for a in actions]
    return base64.b64decode("".join(chunks))


def test_general_code_reference_is_the_gold_patch_in_chunks_then_finish():
    from environments.general import reference
    from environments.general.schemas import MAX_COMMAND

    patch = "diff --git a/x b/x\n" + "+" + "y" * 40000 + "\n"
    plan = reference.plan("t", {"reference": {"patch": patch}})
    assert plan[-1] == {"operation": "finish"}
    assert plan[-2]["command"].startswith(f"base64 -d {reference.STORE} | git apply")
    assert len(plan) > 4 and all(len(a.get("command", "")) <= MAX_COMMAND for a in plan)
    assert _payload(plan[:-2], reference.STORE).decode() == patch


def test_general_agent_reference_is_its_actions(tmp_path):
    from environments.general import reference

    actions = [{"operation": "tool", "server": "crm", "name": "x", "arguments": {}},
               {"operation": "finish", "answer": "done"}]
    (tmp_path / "ga1.oracle.json").write_text(json.dumps(actions))
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "code1.patch").write_text("PATCH")
    assert reference.load(tmp_path, "ga1", "general_agent") == {"actions": actions}
    assert reference.load(tmp_path, "code1", "opensource-code") == {"patch": "PATCH"}
    assert reference.load(tmp_path, "other", "general_agent") is None
    assert reference.plan("ga1", {"reference": {"actions": actions}}) == actions
    (tmp_path / "bad.oracle.json").write_text(json.dumps([{"operation": "shell"}]))
    with pytest.raises(DatasetError, match="ending with finish"):
        reference.load(tmp_path, "bad", "general_agent")
    with pytest.raises(NotFound, match="without a reference"):
        reference.plan("x", {"kind": "general_agent"})


def test_general_episode_plays_the_plan_by_its_step_count():
    from camg.environment import Task
    from environments.general.environment import GeneralEpisode

    actions = [{"operation": "shell", "command": "true"}, {"operation": "finish", "answer": "a"}]
    task = Task("ga1", {"kind": "general_agent", "reference": {"actions": actions}})
    episode = GeneralEpisode(types.SimpleNamespace(), task, "e1")
    assert episode.reference_action() == actions[0]
    episode.steps = 1
    assert episode.reference_action() == actions[1]
    episode.steps = 5   # past the end: keep finishing
    assert episode.reference_action() == actions[1]


def _site_files(plan: list[dict], store: str) -> dict[str, bytes]:
    blob = _payload(plan[:-2], store)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_visual_reference_site_unpacks_into_dist(tmp_path):
    from environments.visual import reference

    site = tmp_path / "t1"
    (site / "img").mkdir(parents=True)
    (site / "index.html").write_text("<!DOCTYPE html><p>hi</p>")
    (site / "img" / "logo.svg").write_bytes(os.urandom(30000))   # several chunks
    loaded = reference.load(tmp_path, "t1")
    plan = reference.plan("t1", {"reference": loaded}, cwd="/workspace", max_command_chars=8000)
    assert plan[-1] == {"operation": "finish"}
    assert plan[-2]["command"].startswith("mkdir -p dist && base64 -d /workspace/.camg-reference.b64"
                                          " | tar -xz -C dist")
    assert all(len(a.get("command", "")) <= 8000 for a in plan) and len(plan) > 4
    assert _site_files(plan, "/workspace/.camg-reference.b64") == {
        "index.html": b"<!DOCTYPE html><p>hi</p>", "img/logo.svg": (site / "img/logo.svg").read_bytes()}
    assert reference.load(tmp_path, "absent") is None
    (tmp_path / "noindex").mkdir()
    (tmp_path / "noindex" / "a.html").write_text("x")
    with pytest.raises(DatasetError, match="index.html"):
        reference.load(tmp_path, "noindex")
    os.symlink("/etc/passwd", site / "link")
    with pytest.raises(DatasetError, match="regular files"):
        reference.load(tmp_path, "t1")
    with pytest.raises(NotFound):
        reference.plan("t2", {}, cwd="/workspace", max_command_chars=8000)


def test_visual_prepare_records_the_sites_and_the_episode_plays_them(tmp_path):
    from camg.environment import Task
    from environments.visual.episode import VisualEpisode
    from environments.visual.prepare import prepare_visual
    from environments.visual.demo import demo_tasks

    rows = demo_tasks.build(tmp_path / "demo")
    renderer = tmp_path / "renderer"
    (renderer / "rootfs").mkdir(parents=True)
    (renderer / "renderer.json").write_text("{}")
    (tmp_path / "mirror.json").write_text("{}")
    body = prepare_visual(rows_path=rows, renderer=renderer, cdn_mirror=tmp_path / "mirror.json",
                          output=tmp_path / "m.json", image="r/x@sha256:" + "0" * 64,
                          references=tmp_path / "demo" / "reference")
    task = body["tasks"][0]
    want = demo_tasks.reference_files(demo_tasks.TASKS[0])
    assert {k: base64.b64decode(v) for k, v in task["data"]["reference"]["files"].items()} == want
    env = types.SimpleNamespace(settings=types.SimpleNamespace(max_command_chars=16000))
    episode = VisualEpisode(env, Task(task["task_id"], task["data"]), "e1")
    plan = [episode.reference_action()]
    while plan[-1]["operation"] != "finish":
        episode.steps += 1
        plan.append(episode.reference_action())
    assert _site_files(plan, "/workspace/.camg-reference.b64") == want
    bare = prepare_visual(rows_path=rows, renderer=renderer, cdn_mirror=tmp_path / "mirror.json",
                          output=tmp_path / "m2.json", image="r/x@sha256:" + "0" * 64)
    assert all("reference" not in t["data"] for t in bare["tasks"])


def test_autoresearch_reference_writes_runs_and_submits_the_packaged_solution(tmp_path):
    from environments.autoresearch.episode import Prepared, ResearchEpisode
    from environments.autoresearch.settings import Settings

    settings = Settings(packages_root=str(tmp_path / "packages"),
                        workspaces_root=str(tmp_path / "workspaces"),
                        private_root=str(tmp_path / "private"), images=str(tmp_path / "i.json"),
                        max_command_chars=2000)
    image = types.SimpleNamespace(env=())
    episode = ResearchEpisode(settings, None, None, Prepared("t1", "x", "/w", image), "e1")
    with pytest.raises(NotFound, match="no reference solution"):
        episode.reference_action()
    script = b"print('solve')\n" * 300
    (tmp_path / "packages" / "t1" / "reference").mkdir(parents=True)
    (tmp_path / "packages" / "t1" / "reference" / "solve.py").write_bytes(script)
    plan = []
    while not plan or plan[-1]["operation"] != "submit":
        plan.append(episode.reference_action())
        episode.steps += 1
    assert all(len(a.get("command", "")) <= 2000 for a in plan) and len(plan) > 4
    assert _payload(plan[:-2], "/workspace/.camg-reference.b64") == script
    assert "python /workspace/.camg-reference.py /task /workspace/submission.csv" in plan[-2]["command"]
    # the private root is never read: only the task package's reference
    assert str(tmp_path / "private") not in json.dumps(plan)
