"""What the suites run against: one target per environment in camg.plugins,
plus ``sandbox`` (tools.reliability.sandbox_env: the framework and real
helper sandboxes with nothing of a product in the way).

A target knows the lower roots its sandboxes need, how to prepare itself
(from the caches the privileged tests and benches build under $CAMG_CACHE)
and how to configure a real ``camg.serve`` process through
``camg.configure``; an environment without such a recipe here is listed
with the reason, never silently left out.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from camg import task_manifest as manifest, plugins
from camg.errors import ConfigError
from tools.reliability import rigged
from tools.reliability.rig import CACHE, minbase
from tools.harness.auth import deployment_auth

SANDBOX_FACTORY = "tools.reliability.sandbox_env:SandboxEnvironment"
#: General's load: every episode is a container running the MiMo transport
#: (stdlib Python since b3f54e8). bench/bench_general.py at 24cc5a3: 13.6 MiB
#: of container cgroup memory idle after reset (11.1 anon, nearly all the
#: transport's, 1.3 cache, 1.1 kernel), 14.2 MiB peak during a shell step,
#: the verifier's own peak 49.5 MiB at finish (133 MiB each and 261 s for 32
#: resets with openenv/FastAPI before). This suite at 256 (--suites load
#: --environments general --load 256 --seconds 10): 256/256 live, 0 errors,
#: created in 305 s (cpu 0.5 each, 2 shared cores), 261 containers holding
#: 3340 MiB (12.8 MiB each), step p50 1.2 s p99 6.0 s, the run 358 s. With
#: General's boot gate (concurrent_boots, 8 here) and the helper's defaults
#: (api_timeout 60 s), on a quiet host, --seconds 2: 256/256 live, 0 errors,
#: created in 225.9 s, 12 MiB each, step p50 1.0 s p99 1.9 s, the run 266 s
#: (without the boot gate: 208.7 s; under other sessions' load it had lost
#: up to 102 of 256 to "tool server down at setup"). Too long for every CI run, so CI's short run asks 2 (Target.short) and
#: --full or --load 256 asks 256. The default capacity comes from the
#: plugin's episode_peak_bytes (still 140 MiB there: 87 here; the measured
#: 50 MiB would give 245, below 256), so the suite sets the capacity.
GENERAL_LOAD = 256
GENERAL_WHY = "at most 256 General containers in one load run"


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
    #: (work, the rig helper's socket) -> tools.reliability.rigged.Rig: a
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
    #: (tools.reliability.escape_container)
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
    from tools.harness.services import clean_git_tree, free_port
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
    body = manifest.build("sandbox", tasks, created_by="tools.reliability",
                          sampling={"mode": "sequential", "seed": 0}, files={})
    path = work / "sandbox-manifest.json"
    work.mkdir(parents=True, exist_ok=True)
    manifest.write(path, body)
    return path, {"lowers": [str(minbase())]}, SANDBOX_FACTORY


def _coding_roots() -> list[str]:
    from tools import oci_demo as demo
    layers = CACHE / "coding" / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    return [str(demo.cache_root_from_env()), str(layers), str(CACHE / "helper")]


def _coding_prepare(work: Path, socket: str) -> tuple[Path, dict, str | None]:
    """The Coding demo (image, task set, task layers), as the privileged tests build it."""
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    from tools import oci_demo as demo
    image = demo.ensure_demo_image(demo.cache_root_from_env())
    demo_set = rigged.coding_demo_set(socket)
    work.mkdir(parents=True, exist_ok=True)
    images = work / "materialized-images.json"
    write_materialized(images, (image.image,))
    out = work / "coding-manifest.json"
    rows = demo_set / "tasks.parquet"
    if not rows.exists():
        rows = demo_set / "tasks.jsonl"
    prepare_coding(rows_path=rows, mirrors_root=demo_set / "mirrors", images_path=images,
                   output=out, layers_root=CACHE / "coding" / "layers")
    return out, {"mirrors_root": str(demo_set / "mirrors"), "images": str(images),
                 "layers_root": str(CACHE / "coding" / "layers"),
                 "memory_bytes": 512 << 20}, None


def _shop_prepare(work: Path, socket: str) -> tuple[Path, dict, str | None]:
    from tools.harness.shop import prepared
    prepared_dir, settings = prepared()
    return (prepared_dir / "manifest.json",
            dict(settings, jvm_heap_mb=512, verify_index_full=False), None)


# Each environment's plugin names its recipe (camg.plugins: ``reliability``).
SANDBOX = Target("sandbox", {"operation": "shell", "command": "echo $((6*7))"},
                 lambda: [str(CACHE / "helper")], _sandbox_prepare)
CODING = Target("coding", {"operation": "shell", "command": "true"}, _coding_roots,
                _coding_prepare)
SHOP = Target("shop", {"action": "search[red shoes]"}, prepare=_shop_prepare)
# A few episodes in the short run of the targets whose episodes cost seconds
# each (a container, a render, a disk upper): CI's time is tight.
AUTORESEARCH = Target("autoresearch", {"operation": "shell", "command": "true"},
                      rig=rigged.autoresearch,
                      # the run ledger stays until the next --check-clean
                      # (environments/autoresearch/runstate.py); the helper
                      # census shows it names no live sandbox
                      state_files=("clean.json", "run.json"),
                      short={"churn": 3, "examples": 3, "load": 4})
# A General episode costs seconds of CPU (a container boot, the transport's
# reset, the verifier): its 1000 churn episodes take about 42 minutes on the
# 2 shared cores, its schemathesis fewer examples in the full run.
GENERAL = Target("general", {"operation": "shell", "command": "true"}, rig=rigged.general,
                 load_max=GENERAL_LOAD, load_why=GENERAL_WHY, load_capacity=GENERAL_LOAD,
                 container_escape=True,
                 short={"churn": 3, "examples": 2, "load": 2}, full={"examples": 20})
VISUAL = Target("visual", {"operation": "shell", "command": "true"}, rig=rigged.visual,
                state_dirs=("screenshots",),
                short={"churn": 3, "examples": 2, "load": 2}, full={"examples": 30})


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
