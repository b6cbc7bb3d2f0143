"""What the targets that need a helper of their own share: AutoResearch's
(a private grader root the helper's deny-list must hold), General's and
Visual's (Docker task containers through the helper's container verbs), in
environments/<env>/checks/reliability.py.

Each such recipe builds its demo from the caches the privileged tests use
($CAMG_CACHE), publishes images to a loopback registry and pulls them into
dockerd by digest (the registry is gone before any service starts, as in
an installation), starts the judges the services call (the scripted local
judges of tools.judge_stub), and returns a ``Rig``: what the runner adds to
that target's helper.json, the service's environment, what must run before
each ``camg.serve`` and how to take it all down again. Containers carry
the helper's ``camg.helper=<scope>`` label with a scope tagged by this
run's pid (devtools.reliability.rig.scope), which the census counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

from devtools.reliability.rig import CACHE, scope


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


def docker_api():
    import docker

    return docker.APIClient(base_url="unix:///var/run/docker.sock", timeout=600)


def pull_into_dockerd(stack: contextlib.ExitStack, refs: list[str]) -> None:
    """Pull by digest while the loopback registry is up; the images are
    removed again when the rig closes (only the refs this run pulled)."""
    api = docker_api()
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


def containers(name: str, images: Path, **extra) -> dict:
    return {
        "images_manifest": str(images),
        "scope": scope(name),
        "max_cpu": 2.0,
        "max_memory_bytes": 2 << 30,
        "max_pids": 2048,
        "containers_per_peer": 300,
        "containers_total": 512,
        **extra,
    }
