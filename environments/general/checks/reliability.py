"""How the reliability suites (devtools/reliability) run General: its target
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
from devtools.reliability.rigged import Rig, containers, pull_into_dockerd
from devtools.reliability.targets import Target
from environments.coding.checks.reliability import cached_demo_set as coding_demo_set

#: General's load: every episode is a container running the MiMo transport.
#: The load suite asks 256 with --full or --load 256 (the measurements are
#: environments/general/checks/bench.py's); too long for every CI run, so CI's short run
#: asks 2 (Target.short). The suite sets the capacity: the plugin's
#: episode_peak_bytes gives a default below 256 on a 2-core host.
GENERAL_LOAD = 256
GENERAL_WHY = "at most 256 General containers in one load run"


def rig(work: Path, socket: str) -> Rig:
    """General's demo set (3 opensource-code tasks from the Coding demo set,
    the general_agent office tasks), one image each, and a judge that
    always answers score 1 (tools.judge_stub.FakeJudge)."""
    from environments.general.build import agent_env
    from environments.general.demo import assemble as demo
    from environments.general.prepare import prepare_general
    from tools.judge_stub import FakeJudge, Reply
    from tools.loopback_registry import LocalRegistry

    demo_set = coding_demo_set(socket)
    rig_stack = contextlib.ExitStack()
    try:
        with LocalRegistry(work / "registry") as registry:
            built = demo.build(CACHE, demo_set, registry.address, work / "demo")
            pull_into_dockerd(rig_stack, built["refs"])
        prepared = work / "prepared"
        prepare_general(
            code_rows=str(built["code_rows"]),
            general_rows=str(built["general_rows"]),
            envs=str(built["envs"]),
            images=str(built["images"]),
            output_dir=prepared,
            references=str(built["out"]),
        )  # served only where references: true
        images = work / "container-images.json"
        images.write_text(json.dumps({"images": built["refs"]}))
        judge = rig_stack.enter_context(FakeJudge(default=Reply(text='{"score": 1}')))
        # boot_wait_s: the load suite's 256 resets at once boot 8 at a time
        # (concurrent_boots' default here) for about 210 s; the last may wait
        # nearly that long, within the reset deadline below
        settings = {
            "pool_size": 1,
            "cpu": 0.5,
            "memory_bytes": 512 << 20,
            "pids_max": 256,
            "boot_wait_s": 380.0,
            "judge_timeout_s": 10.0,
            "judge_attempts": 2,
            "judge_backoff_s": 0.05,
        }
        helper = {
            "lower_roots": [str(CACHE / "helper")],
            "containers": containers(
                "general",
                images,
                agent_env_source=str(agent_env.cached(CACHE)),
                # below the escape battery's FILL_MIB and
                # INODE_CAP (devtools/reliability/escape_container.py)
                upper_bytes=256 << 20,
                upper_inodes=16384,
            ),
        }
        env = {
            "GA_JUDGE_URL": judge.url,
            "GA_JUDGE_MODEL": "reliability-judge",
            "GA_JUDGE_KEY": "sk-reliability",
            "GA_JUDGE_API": "chat",
        }
        # environments/general/README.md: action_timeout_s >= 1900 (the verifier)
        limits = {"action_timeout_s": 1900.0, "reset_timeout_s": 400.0, "grade_timeout_s": 300.0}
        return Rig(
            helper,
            (prepared / "manifest.json", settings, None),
            env,
            limits=limits,
            images=built["refs"],
            pooled=int(settings["pool_size"]) * len(built["refs"]),
            stack=rig_stack,
        )
    except BaseException:
        rig_stack.close()
        raise


# A General episode costs seconds of CPU (a container boot, the transport's
# reset, the verifier): its 1000 churn episodes take about 42 minutes on the
# 2 shared cores, its schemathesis fewer examples in the full run.
TARGET = Target(
    "general",
    {"operation": "shell", "command": "true"},
    rig=rig,
    load_max=GENERAL_LOAD,
    load_why=GENERAL_WHY,
    load_capacity=GENERAL_LOAD,
    container_escape=True,
    short={"churn": 3, "examples": 2, "load": 2},
    full={"examples": 20},
)


# Driven to its finish by the deployment's reference solution.
def storm(guest: Guest, env: Env) -> Env:
    return dataclasses.replace(
        env,
        create={"task_id": first_task(guest, env)["task_id"]},
        slow_step=SLEEP,
        reference=True,
        finish=FINISH,
        grader="container",
    )
