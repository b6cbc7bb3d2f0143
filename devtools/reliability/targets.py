"""What the suites run against: one target per environment in camg.plugins,
plus ``sandbox`` (devtools.reliability.sandbox_env: the framework and real
helper sandboxes with nothing of a product in the way).

A target knows the lower roots its sandboxes need, how to prepare itself
(from the caches the privileged tests and benches build under $CAMG_CACHE)
and how to configure a real ``camg.serve`` process through
``camg.configure``. Each environment's recipe is in its own package
(environments/<env>/checks/reliability.py, named by its plugin); one
without a recipe is listed with the reason, never silently left out.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from camg import plugins
from camg.config import task_manifest as manifest
from camg.errors import ConfigError
from devtools.harness.auth import deployment_auth
from devtools.reliability.rig import CACHE, minbase

SANDBOX_FACTORY = "devtools.reliability.sandbox_env:SandboxEnvironment"


@dataclasses.dataclass
class Target:
    name: str
    #: a cheap action that never ends the episode (load, churn)
    action: dict
    lower_roots: Callable[[], list[str]] = lambda: []
    #: (work, helper socket) -> (manifest path, settings, factory or None)
    prepare: Callable[[Path, str], tuple[Path, dict, str | None]] | None = None
    #: why it cannot run here (None: it can)
    missing: str | None = None
    #: (work, the rig helper's socket) -> devtools.reliability.rigged.Rig: a
    #: target that needs a helper of its own (private roots, containers);
    #: it then prepares itself there instead of in ``prepare``
    rig: Callable | None = None
    #: state-directory entries besides outcomes.jsonl and trajectories/
    #: (a directory: only files named for an episode of the run)
    state_files: tuple[str, ...] = ()
    state_dirs: tuple[str, ...] = ()
    #: the most concurrent episodes the load suite asks of it, and why
    load_max: int | None = None
    load_why: str = ""
    #: the capacity the load suite configures (None: the environment's
    #: default, which the run then also shows holds)
    load_capacity: int | None = None
    #: the escape battery also runs inside one of its containers
    #: (devtools.reliability.escape_container)
    container_escape: bool = False
    #: sizes (SHORT/FULL keys: churn, examples, load ...) this target runs
    #: instead of the run's, in the short (CI) and the full run
    short: dict = dataclasses.field(default_factory=dict)
    full: dict = dataclasses.field(default_factory=dict)


def configure(target: Target, work: Path, prepared: tuple[Path, dict, str | None], socket: str,
              *, capacity: int | None, limits: dict) -> Path:
    """camg.configure for one service on a free loopback port; its config path
    (``capacity`` None: the environment's default capacity)."""
    from camg.configure import configure as run_configure
    from devtools.harness.services import clean_git_tree, free_port
    manifest_path, settings, factory = prepared
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.lock").write_text("falcon==4.4.0\n")
    env = {"manifest": str(manifest_path), "port": free_port(), "limits": limits,
           "settings": settings}
    if capacity is not None:
        env["capacity"] = capacity
    if factory:
        env["factory"] = factory
    deployment = {"runtime_lock": str(work / "requirements.lock"),
                  "state_root": str(work / "state"), "helper_socket": socket,
                  "executables": {"python": sys.executable}, "auth": deployment_auth(),
                  "environments": {target.name: env}}
    (work / "deployment.json").write_text(json.dumps(deployment))
    run_configure(work / "deployment.json", work / "prepared",
                  source_tree=clean_git_tree(work / "src"))
    return work / "prepared" / f"{target.name}.json"


# -- the targets -----------------------------------------------------------------

def _sandbox_prepare(work: Path, socket: str) -> tuple[Path, dict, str | None]:
    tasks = [{"task_id": f"t{i:03d}", "data": {"target": i}} for i in range(16)]
    body = manifest.build("sandbox", tasks, created_by="devtools.reliability",
                          sampling={"mode": "sequential", "seed": 0}, files={})
    path = work / "sandbox-manifest.json"
    work.mkdir(parents=True, exist_ok=True)
    manifest.write(path, body)
    return path, {"lowers": [str(minbase())]}, SANDBOX_FACTORY


# Each environment's plugin names its recipe (camg.plugins: ``reliability``).
SANDBOX = Target("sandbox", {"operation": "shell", "command": "echo $((6*7))"},
                 lambda: [str(CACHE / "helper")], _sandbox_prepare)
def recipes() -> dict[str, Target]:
    """``sandbox``, then every registered environment's recipe (its plugin's
    ``reliability``), in registry order; one without a recipe, or whose
    recipe does not load, is listed ``missing`` with the reason."""
    out = {"sandbox": SANDBOX}
    for name, plugin in plugins.all_plugins().items():
        if plugin.reliability is None:
            out[name] = Target(name, {}, missing="no demo preparation in the runner yet: "
                                                 "run its suites against a prepared service")
            continue
        try:
            recipe = plugins.resolve(plugin.reliability)
        except ConfigError as exc:
            recipe = Target(name, {}, missing=str(exc))
        if not isinstance(recipe, Target) or recipe.name != name:
            recipe = Target(name, {}, missing=f"{plugin.reliability} is not a Target named {name!r}")
        out[name] = recipe
    return out


def all_targets() -> list[Target]:
    """``sandbox`` first, then every registered environment, in registry order."""
    return list(recipes().values())
