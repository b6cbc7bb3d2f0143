"""A general_agent episode of the General service with its task container
and verifier archive stood in for (the judge is a local fake server): what
the judging and regrade unit tests share."""

from __future__ import annotations

import io
import json
import tarfile
import types

from camg.environment import ServiceContext, Task
from camg.grading.judge import Judge, JudgeConfig
from environments.general.environment import GeneralEnvironment

IMAGE = "r/x@sha256:" + "0" * 64


def verifier_tar(detail: dict) -> bytes:
    """The archive get_archive returns: verifier/reward_detail.json."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = json.dumps(detail).encode()
        info = tarfile.TarInfo("verifier/reward_detail.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def judged_episode(tmp_path, detail: dict, judge_url: str, *, timeout_s: float,
                   settings: dict | None = None):
    """(environment, episode) whose finish is pending the judge at
    ``judge_url`` and whose container holds ``detail``; the caller closes
    ``environment.judge``."""
    task = Task("ga", {"kind": "general_agent", "image": IMAGE, "instance_id": "ga"})
    env = GeneralEnvironment(ServiceContext("general", str(tmp_path), settings or {}), [task])
    env.judge = Judge(JudgeConfig.from_env("GA_JUDGE", {
        "GA_JUDGE_URL": judge_url, "GA_JUDGE_MODEL": "m", "GA_JUDGE_KEY": "k"},
        attempts=1, timeout_s=timeout_s))
    archive = verifier_tar(detail)
    env.client = types.SimpleNamespace(get_archive=lambda cid, path: archive)
    episode = env.create_episode(task, seed=None, episode_id="e")
    episode.container = types.SimpleNamespace(id="c" * 12)
    episode.pending_judge = True
    return env, episode
