"""How the reliability suites (devtools/reliability) run Visual: its target
(the plugin's ``reliability``: how a real service of it is prepared and
configured from the caches the privileged tests build) and its kill-storm
drive (the plugin's ``storm``: how a storm's episodes reach its grader).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

from devtools.reliability.killstorm_guest import FINISH, SLEEP, Env, Guest, first_task
from devtools.reliability.rig import CACHE
from devtools.reliability.rigged import Rig, containers, docker_api, pull_into_dockerd
from devtools.reliability.targets import Target


def rig(work: Path, socket: str) -> Rig:
    """Visual's demo tasks on the privileged tests' container image (Debian
    minbase), renders in the renderer sandbox (headless Chromium, the CDN
    mirror), the image-statistics judge (tools.judge_stub.scripted_judge)."""
    from devtools.harness import container_image as ci
    from devtools.reliability.rig import minbase
    from environments.visual.build.cdn_mirror import build_mirror
    from environments.visual.build.renderer_rootfs import ensure_renderer_rootfs
    from environments.visual.demo import demo_tasks
    from environments.visual.prepare import prepare_visual
    from tools.judge_stub import scripted_judge
    from tools.loopback_registry import LocalRegistry

    renderer = ensure_renderer_rootfs(CACHE / "helper")
    mirror = build_mirror(CACHE / "visual" / "cdn-mirror")
    rig_stack = contextlib.ExitStack()
    try:
        api = docker_api()
        rig_stack.callback(api.close)
        # The registry goes before the service starts, as in an
        # installation: the image is in dockerd by digest.
        with LocalRegistry(work / "registry") as registry:
            ref = ci.publish_test_image(
                api, minbase(), registry.address, repository="camg-rel/visual"
            )
            pull_into_dockerd(rig_stack, [ref])
        rows = demo_tasks.build(work / "demo")
        prepare_visual(
            rows_path=rows,
            renderer=renderer,
            cdn_mirror=mirror,
            output=work / "visual-manifest.json",
            image=ref,
            references=work / "demo" / "reference",
        )  # served only where enabled
        images = work / "container-images.json"
        images.write_text(json.dumps({"images": [ref]}))
        judge = rig_stack.enter_context(scripted_judge())
        settings = {
            "memory_bytes": 256 << 20,
            "cpu": 0.5,
            "pids_max": 256,
            "pool_size": 1,
            "render_timeout": 240,
            "render_memory_bytes": 1 << 30,
            "judge_backoff_s": 0.0,
            "judge_attempts": 2,
        }
        helper = {
            "lower_roots": [str(CACHE / "helper")],
            "containers": containers("visual", images),
        }
        env = {
            "WD_JUDGE_URL": judge.url,
            "WD_JUDGE_MODEL": "reliability-vision",
            "WD_JUDGE_KEY": "sk-reliability",
        }
        limits = {"action_timeout_s": 600, "grade_timeout_s": 300}  # a render, then the judge
        return Rig(
            helper,
            (work / "visual-manifest.json", settings, None),
            env,
            limits=limits,
            images=[ref],
            pooled=int(settings["pool_size"]),
            stack=rig_stack,
        )
    except BaseException:
        rig_stack.close()
        raise


TARGET = Target(
    "visual",
    {"operation": "shell", "command": "true"},
    rig=rig,
    state_dirs=("screenshots",),
    short={"churn": 3, "examples": 2, "load": 2},
    full={"examples": 30},
)


# Driven to its finish by the deployment's reference solution.
def storm(guest: Guest, env: Env) -> Env:
    # The finish copies dist/ out, removes the container and renders in the
    # helper's renderer sandbox.
    return dataclasses.replace(
        env,
        create={"task_id": first_task(guest, env)["task_id"]},
        slow_step=SLEEP,
        reference=True,
        finish=FINISH,
        grader="sandbox",
        grader_what="renderer sandbox",
    )
