"""Targets that need a helper of their own: AutoResearch (a private grader
root the helper's deny-list must hold), General and Visual (Docker task
containers through the helper's container verbs).

Each recipe builds its demo from the caches the privileged tests use
($CAMG_CACHE), publishes images to a loopback registry and pulls them into
dockerd by digest (the registry is gone before any service starts, as in
an installation), starts the judges the services call (the scripted local
judges of tools.judge_stub), and returns a ``Rig``: what the runner adds to
that target's helper.json, the service's environment, what must run before
each ``camg.serve`` and how to take it all down again. Containers carry
the helper's ``camg.helper=<scope>`` label with a scope tagged by this
run's pid (tools.reliability.rig.scope), which the census counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tools.reliability.rig import CACHE, ROOT, scope

GRADER_USER = "camg-grader"


def coding_demo_set(socket: str) -> Path:
    """The Coding demo task set (cached; built in sandboxes of ``socket``):
    Coding's target and General's (its opensource-code tasks) share it."""
    from tools import oci_demo as demo
    from environments.coding.demo.demo_tasks import fetch_sdist
    from environments.coding.demo.sandbox_runner import ensure_demo_set
    image = demo.ensure_demo_image(demo.cache_root_from_env())
    return ensure_demo_set(CACHE / "coding", image.image, socket,
                           fetch_sdist(CACHE / "coding" / "sdist"))


@dataclasses.dataclass
class Rig:
    #: helper.json: lower_roots plus any private_roots / containers section
    helper: dict
    #: (manifest path, settings, factory or None), as Target.prepare returns
    prepared: tuple[Path, dict, str | None]
    #: the service's environment (judge endpoints: never settings)
    env: dict = dataclasses.field(default_factory=dict)
    #: run on each configured service before it starts (its config path)
    pre_serve: Callable[[Path], None] | None = None
    #: the deployment's limits its episodes need (merged over each suite's):
    #: a finish that runs a verifier or a render outlasts the defaults
    limits: dict = dataclasses.field(default_factory=dict)
    #: the task images (REPO@sha256:...) its containers run
    images: list[str] = dataclasses.field(default_factory=list)
    #: warm containers its service keeps started while it serves
    pooled: int = 0
    stack: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self.stack.close()


def _docker_api():
    import docker
    return docker.APIClient(base_url="unix:///var/run/docker.sock", timeout=600)


def _pull_into_dockerd(stack: contextlib.ExitStack, refs: list[str]) -> None:
    """Pull by digest while the loopback registry is up; the images are
    removed again when the rig closes (only the refs this run pulled)."""
    api = _docker_api()
    stack.callback(api.close)
    for ref in refs:
        for line in api.pull(ref, stream=True, decode=True):
            if isinstance(line, dict) and line.get("error"):
                raise RuntimeError(f"pulling {ref}: {line['error']}")
        stack.callback(_remove_image, api, ref)


def _remove_image(api, ref: str) -> None:
    import docker.errors
    try:
        api.remove_image(ref, force=True)
    except docker.errors.NotFound:
        pass  # never pulled, or already removed


def _containers(name: str, images: Path, **extra) -> dict:
    return {"images_manifest": str(images), "scope": scope(name), "max_cpu": 2.0,
            "max_memory_bytes": 2 << 30, "max_pids": 2048, "containers_per_peer": 300,
            "containers_total": 512, **extra}


# -- AutoResearch ---------------------------------------------------------------

def _ensure_grader_user() -> None:
    try:
        pwd.getpwnam(GRADER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", GRADER_USER], check=True)


def _check_clean(config: Path) -> None:
    """AutoResearch serves only a state directory checked clean first."""
    out = subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(config),
                          "--check-clean"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"--check-clean failed: {out.stderr[-1000:]}")


def autoresearch(work: Path, socket: str) -> Rig:
    """The demo tasks (scikit-learn data) on the research image, as
    tests/privileged/test_autoresearch_episodes.py prepares them."""
    from camg.oci.images import write_materialized
    from environments.autoresearch.prepare import prepare
    from tools import oci_demo
    from environments.autoresearch.demo import demo_tasks, image
    _ensure_grader_user()
    research = image.ensure_image(oci_demo.cache_root_from_env())
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o711)  # the grader uid reaches its private root below
    demo_tasks.build(work / "bundles")
    images = work / "materialized-images.json"
    write_materialized(images, (research.image,))
    roots = {k: work / k for k in ("packages", "workspaces", "private")}
    prepare(source=work / "bundles", packages_root=roots["packages"],
            workspaces_root=roots["workspaces"], private_root=roots["private"], images=images,
            image_name="camg/demo-autoresearch", output=work / "manifest.json",
            grader_user=GRADER_USER)
    settings = {"packages_root": str(roots["packages"]),
                "workspaces_root": str(roots["workspaces"]),
                "private_root": str(roots["private"]), "images": str(images),
                "memory_bytes": 512 << 20, "cpu_quota": 1.0, "pids_max": 256,
                "disk_bytes": 64 << 20, "command_minutes": 5, "episode_minutes": 30}
    helper = {"lower_roots": [str(oci_demo.cache_root_from_env()), str(roots["workspaces"]),
                              str(CACHE / "helper")],
              "private_roots": [str(roots["private"])]}
    return Rig(helper, (work / "manifest.json", settings, None), pre_serve=_check_clean,
               limits={"action_timeout_s": 400})


# -- General ----------------------------------------------------------------------

def general(work: Path, socket: str) -> Rig:
    """General's demo set (3 opensource-code tasks from the Coding demo set,
    the general_agent office tasks), one image each, and a judge that
    always answers score 1 (tools.judge_stub.FakeJudge)."""
    from environments.general.prepare import prepare_general
    from environments.general.build import agent_env
    from environments.general.demo import assemble as demo
    from tools.judge_stub import FakeJudge, Reply
    from tools.loopback_registry import LocalRegistry
    demo_set = coding_demo_set(socket)
    rig_stack = contextlib.ExitStack()
    try:
        with LocalRegistry(work / "registry") as registry:
            built = demo.build(CACHE, demo_set, registry.address, work / "demo")
            _pull_into_dockerd(rig_stack, built["refs"])
        prepared = work / "prepared"
        prepare_general(code_rows=str(built["code_rows"]), general_rows=str(built["general_rows"]),
                        envs=str(built["envs"]), images=str(built["images"]), output_dir=prepared,
                        references=str(built["out"]))  # served only where references: true
        images = work / "container-images.json"
        images.write_text(json.dumps({"images": built["refs"]}))
        judge = rig_stack.enter_context(FakeJudge(default=Reply(text='{"score": 1}')))
        # boot_wait_s: the load suite's 256 resets at once boot 8 at a time
        # (concurrent_boots' default here) for about 210 s; the last may wait
        # nearly that long, within the reset deadline below
        settings = {"pool_size": 1, "cpu": 0.5, "memory_bytes": 512 << 20, "pids_max": 256,
                    "boot_wait_s": 380.0, "judge_timeout_s": 10.0, "judge_attempts": 2,
                    "judge_backoff_s": 0.05}
        helper = {"lower_roots": [str(CACHE / "helper")],
                  "containers": _containers("general", images,
                                            agent_env_source=str(agent_env.cached(CACHE)),
                                            # below the escape battery's FILL_MIB and
                                            # INODE_CAP (tools/reliability/escape_container.py)
                                            upper_bytes=256 << 20, upper_inodes=16384)}
        env = {"GA_JUDGE_URL": judge.url, "GA_JUDGE_MODEL": "reliability-judge",
               "GA_JUDGE_KEY": "sk-reliability", "GA_JUDGE_API": "chat"}
        # environments/general/README.md: action_timeout_s >= 1900 (the verifier)
        limits = {"action_timeout_s": 1900.0, "reset_timeout_s": 400.0, "grade_timeout_s": 300.0}
        return Rig(helper, (prepared / "manifest.json", settings, None), env, limits=limits,
                   images=built["refs"], pooled=settings["pool_size"] * len(built["refs"]),
                   stack=rig_stack)
    except BaseException:
        rig_stack.close()
        raise


# -- Visual -----------------------------------------------------------------------

def visual(work: Path, socket: str) -> Rig:
    """Visual's demo tasks on the privileged tests' container image (Debian
    minbase), renders in the renderer sandbox (headless Chromium, the CDN
    mirror), the image-statistics judge (tools.judge_stub.scripted_judge)."""
    from environments.visual.prepare import prepare_visual
    from tools.harness import container_image as ci
    from tools.judge_stub import scripted_judge
    from tools.loopback_registry import LocalRegistry
    from tools.reliability.rig import minbase
    from environments.visual.demo import demo_tasks
    from environments.visual.build.cdn_mirror import build_mirror
    from environments.visual.build.renderer_rootfs import ensure_renderer_rootfs
    renderer = ensure_renderer_rootfs(CACHE / "helper")
    mirror = build_mirror(CACHE / "visual" / "cdn-mirror")
    rig_stack = contextlib.ExitStack()
    try:
        api = _docker_api()
        rig_stack.callback(api.close)
        # The registry goes before the service starts, as in an
        # installation: the image is in dockerd by digest.
        with LocalRegistry(work / "registry") as registry:
            ref = ci.publish_test_image(api, minbase(), registry.address,
                                        repository="camg-rel/visual")
            _pull_into_dockerd(rig_stack, [ref])
        rows = demo_tasks.build(work / "demo")
        prepare_visual(rows_path=rows, renderer=renderer, cdn_mirror=mirror,
                       output=work / "visual-manifest.json", image=ref,
                       references=work / "demo" / "reference")  # served only where enabled
        images = work / "container-images.json"
        images.write_text(json.dumps({"images": [ref]}))
        judge = rig_stack.enter_context(scripted_judge())
        settings = {"memory_bytes": 256 << 20, "cpu": 0.5, "pids_max": 256, "pool_size": 1,
                    "render_timeout": 240, "render_memory_bytes": 1 << 30,
                    "judge_backoff_s": 0.0, "judge_attempts": 2}
        helper = {"lower_roots": [str(CACHE / "helper")],
                  "containers": _containers("visual", images)}
        env = {"WD_JUDGE_URL": judge.url, "WD_JUDGE_MODEL": "reliability-vision",
               "WD_JUDGE_KEY": "sk-reliability"}
        limits = {"action_timeout_s": 600, "grade_timeout_s": 300}  # a render, then the judge
        return Rig(helper, (work / "visual-manifest.json", settings, None), env, limits=limits,
                   images=[ref],
                   pooled=settings["pool_size"], stack=rig_stack)
    except BaseException:
        rig_stack.close()
        raise
