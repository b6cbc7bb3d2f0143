"""How the reliability suites (devtools/reliability) run AutoResearch: its target
(the plugin's ``reliability``: how a real service of it is prepared and
configured from the caches the privileged tests build) and its kill-storm
drive (the plugin's ``storm``: how a storm's episodes reach its grader).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import subprocess
import sys
from pathlib import Path

from devtools.reliability.killstorm_guest import SLEEP, Env, Guest, first_task
from devtools.reliability.rig import CACHE, ROOT
from devtools.reliability.rigged import Rig
from devtools.reliability.targets import Target

GRADER_USER = "camg-grader"


def _ensure_grader_user() -> None:
    try:
        pwd.getpwnam(GRADER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                GRADER_USER,
            ],
            check=True,
        )


def _check_clean(config: Path) -> None:
    """AutoResearch serves only a state directory checked clean first."""
    out = subprocess.run(
        [sys.executable, "-m", "camg.serve", "--config", str(config), "--check-clean"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"--check-clean failed: {out.stderr[-1000:]}")


def rig(work: Path, socket: str) -> Rig:
    """The demo tasks (scikit-learn data) on the research image, as
    tests/privileged/test_autoresearch_episodes.py prepares them."""
    from camg.oci.images import write_materialized
    from environments.autoresearch.demo import demo_tasks, image
    from environments.autoresearch.prepare import prepare
    from tools import oci_demo

    _ensure_grader_user()
    research = image.ensure_image(oci_demo.cache_root_from_env())
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o711)  # the grader uid reaches its private root below
    demo_tasks.build(work / "bundles")
    images = work / "materialized-images.json"
    write_materialized(images, (research.image,))
    roots = {k: work / k for k in ("packages", "workspaces", "private")}
    prepare(
        source=work / "bundles",
        packages_root=roots["packages"],
        workspaces_root=roots["workspaces"],
        private_root=roots["private"],
        images=images,
        image_name="camg/demo-autoresearch",
        output=work / "manifest.json",
        grader_user=GRADER_USER,
    )
    settings = {
        "packages_root": str(roots["packages"]),
        "workspaces_root": str(roots["workspaces"]),
        "private_root": str(roots["private"]),
        "images": str(images),
        "memory_bytes": 512 << 20,
        "cpu_quota": 1.0,
        "pids_max": 256,
        "disk_bytes": 64 << 20,
        "command_minutes": 5,
        "episode_minutes": 30,
    }
    helper = {
        "lower_roots": [
            str(oci_demo.cache_root_from_env()),
            str(roots["workspaces"]),
            str(CACHE / "helper"),
        ],
        "private_roots": [str(roots["private"])],
    }
    return Rig(
        helper,
        (work / "manifest.json", settings, None),
        pre_serve=_check_clean,
        limits={"action_timeout_s": 400},
    )


# A few episodes in the short run of the targets whose episodes cost seconds
# each (a container, a render, a disk upper): CI's time is tight.
TARGET = Target(
    "autoresearch",
    {"operation": "shell", "command": "true"},
    rig=rig,
    # the run ledger stays until the next --check-clean
    # (environments/autoresearch/runstate.py); the helper
    # census shows it names no live sandbox
    state_files=("clean.json", "run.json"),
    short={"churn": 3, "examples": 3, "load": 4},
)


# A finish runs the deployment's reference solution (the demo enables
# references), so an undisturbed finish earns the maximum, never 0.
def storm(guest: Guest, env: Env) -> Env:
    return dataclasses.replace(
        env,
        create={"task_id": first_task(guest, env)["task_id"]},
        slow_step=SLEEP,
        reference=True,
        finish={"operation": "submit"},
        grader="process",
        grader_user="camg-grader",
    )
