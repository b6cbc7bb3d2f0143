"""How the reliability suites (devtools/reliability) run Coding: its target
(the plugin's ``reliability``: how a real service of it is prepared and
configured from the caches the privileged tests build) and its kill-storm
drive (the plugin's ``storm``: how a storm's episodes reach its grader).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from devtools.reliability.killstorm_guest import FINISH, SLEEP, Env, Guest, first_task
from devtools.reliability.rig import CACHE
from devtools.reliability.targets import Target


def cached_demo_set(socket: str) -> Path:
    """The Coding demo task set as the privileged tests build it ($CAMG_CACHE):
    Coding's target and General's (its opensource-code tasks) share it."""
    from environments.coding.demo.data import built_demo_set

    return built_demo_set(CACHE, socket)


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
    demo_set = cached_demo_set(socket)
    work.mkdir(parents=True, exist_ok=True)
    images = work / "materialized-images.json"
    write_materialized(images, (image.image,))
    out = work / "coding-manifest.json"
    rows = demo_set / "tasks.parquet"
    if not rows.exists():
        rows = demo_set / "tasks.jsonl"
    prepare_coding(
        rows_path=rows,
        mirrors_root=demo_set / "mirrors",
        images_path=images,
        output=out,
        layers_root=CACHE / "coding" / "layers",
    )
    return (
        out,
        {
            "mirrors_root": str(demo_set / "mirrors"),
            "images": str(images),
            "layers_root": str(CACHE / "coding" / "layers"),
            "memory_bytes": 512 << 20,
        },
        None,
    )


TARGET = Target("coding", {"operation": "shell", "command": "true"}, _coding_roots, _coding_prepare)


def storm(guest: Guest, env: Env) -> Env:
    task = first_task(guest, env)
    fix = f"git apply -R - <<'CAMG_EOF'\n{task['data']['patch']}\nCAMG_EOF"
    return dataclasses.replace(
        env,
        create={"task_id": task["task_id"]},
        slow_step=SLEEP,
        to_grading=[{"operation": "shell", "command": fix}],
        finish=FINISH,
        grader="sandbox",
    )
