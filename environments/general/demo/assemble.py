"""General's demo task set, end to end: rows, task folders, images by digest.

* opensource-code: the first ``code_count`` rows of the Coding demo set
  (apispec 6.8.1 from PyPI with SWE-smith-style bugs; environments.coding.demo) turned
  into MiMo instances (environments.general.demo.code_tasks);
* general_agent: the office tasks of environments.general.demo.agent_tasks;
* one image per task (environments.general.demo.images), pushed to ``registry`` and
  named by digest in ``image-mapping.jsonl`` (upstream's format);
* ``code.jsonl`` / ``general.jsonl`` rows in NeMo-Gym's shape
  (``{"instance": ...}``) and ``envs/<id>`` task folders, ready for
  ``python -m camg.prepare --environment general``.

Oracle material for tests and the demo stays beside it: ``gold/<id>.patch``
for code tasks, ``<id>.oracle.json`` action lists for general_agent tasks;
``build`` also returns each code task's folder (``code_tasks``, by instance
id) for the agent-view leak check (environments.general.demo.code_tasks.container_leaks).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from camg.config.host_private import private_dir
from environments.general.demo import agent_tasks, code_tasks, images
from tools import oci_demo

IMAGE_NAME = "camg/mimo-general"


def build(
    cache_root: Path, coding_demo: Path, registry: str, out: Path, *, code_count: int = 3
) -> dict:
    cache_root, out = Path(cache_root), Path(out)
    work = cache_root / "general" / "tasks"
    # One builder at a time: CI's lanes (and a second checkout) share the
    # cache, and the task folders are rebuilt in place (build_all, a code
    # task's scratch source): a concurrent builder removed files from under
    # another's copy (a cold-cache rehearsal failed 23 General tests so).
    with oci_demo.locked(work.with_name("tasks.lock")):
        return _build(cache_root, coding_demo, registry, out, work, code_count)


def _build(
    cache_root: Path, coding_demo: Path, registry: str, out: Path, work: Path, code_count: int
) -> dict:
    rows = [json.loads(line) for line in (coding_demo / "tasks.jsonl").read_text().splitlines()]
    mirror_root = coding_demo / "mirrors"
    code_dirs = []
    for row in rows[:code_count]:
        mirror = mirror_root / row["repo"].split("/", 1)[1]
        target = work / "code" / row["instance_id"]
        if not (target / "instance.json").is_file():
            code_tasks.from_coding_row(row, mirror, target)
        code_dirs.append(target)
    general_dirs = agent_tasks.build_all(work / "general")
    # Gold patches and oracle lists: grading material, root's and the
    # services' only from the start.
    private_dir(out)
    private_dir(out / "gold")
    shutil.rmtree(out / "envs", ignore_errors=True)
    mapping, code_rows, general_rows = [], [], []
    for kind, dirs in (("opensource-code", code_dirs), ("general_agent", general_dirs)):
        for task_dir in dirs:
            instance = json.loads((task_dir / "instance.json").read_text())
            layout_dir, tag, digest = images.build_task_image(cache_root, task_dir, kind)
            ref = images.publish(layout_dir, tag, digest, registry)
            instance["docker_image"] = f"{IMAGE_NAME}:{tag}"
            mapping.append({"dataset_image": instance["docker_image"], "dockerhub_image": ref})
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": instance["problem_statement"]}],
                    "metadata": {"workdir": instance["cwd"]},
                },
                "instance": instance,
                "subset": "code" if kind == "opensource-code" else "general",
            }
            if kind == "opensource-code":
                code_rows.append(row)
                shutil.copyfile(
                    task_dir / "gold.patch", out / "gold" / f"{instance['instance_id']}.patch"
                )
            else:
                general_rows.append(row)
                shutil.copytree(task_dir, out / "envs" / instance["instance_id"])
                (out / "envs" / instance["instance_id"] / "instance.json").write_text(
                    json.dumps(instance, indent=1)
                )
                shutil.copyfile(
                    task_dir.parent / f"{instance['instance_id']}.oracle.json",
                    out / f"{instance['instance_id']}.oracle.json",
                )
    for name, items in (
        ("code.jsonl", code_rows),
        ("general.jsonl", general_rows),
        ("image-mapping.jsonl", mapping),
    ):
        (out / name).write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items))
    code_tasks_by_id = {
        json.loads((d / "instance.json").read_text())["instance_id"]: d for d in code_dirs
    }
    return {
        "code_rows": out / "code.jsonl",
        "general_rows": out / "general.jsonl",
        "envs": out / "envs",
        "images": out / "image-mapping.jsonl",
        "refs": [m["dockerhub_image"] for m in mapping],
        "out": out,
        "code_tasks": code_tasks_by_id,
    }


def prepare_data(data: Path, cache_root: Path, coding_demo: Path) -> dict:
    """Everything the demo's General service needs under ``data``/general:
    the prepared manifest and tables, the helper's allowed-images manifest
    (``container-images.json``) and the agent environment. The images are
    pushed to a throwaway loopback registry and pulled into dockerd by
    digest, so the service finds them after the registry is gone."""
    import tempfile

    from environments.general.build import agent_env
    from environments.general.prepare import prepare_general
    from tools.loopback_registry import LocalRegistry

    out = Path(data) / "general"
    with (
        tempfile.TemporaryDirectory(prefix="camg-general-registry.") as state,
        LocalRegistry(Path(state)) as registry,
    ):
        built = build(cache_root, coding_demo, registry.address, out / "demo")
        import docker

        api = docker.APIClient(base_url="unix:///var/run/docker.sock", timeout=600)
        try:
            for ref in built["refs"]:
                for line in api.pull(ref, stream=True, decode=True):
                    if isinstance(line, dict) and line.get("error"):
                        raise RuntimeError(f"pulling {ref}: {line['error']}")
        finally:
            api.close()
    prepare_general(
        code_rows=str(built["code_rows"]),
        general_rows=str(built["general_rows"]),
        envs=str(built["envs"]),
        images=str(built["images"]),
        output_dir=out,
        references=str(built["out"]),
    )
    (out / "container-images.json").write_text(
        json.dumps({"images": built["refs"]}, indent=1) + "\n"
    )
    env_dir = agent_env.build(out / "agent-env")
    return {
        "manifest": out / "manifest.json",
        "container_images": out / "container-images.json",
        "agent_env": env_dir,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    ap = argparse.ArgumentParser(description="Prepare General's demo data (root, dockerd).")
    ap.add_argument("--data", required=True, help="e.g. /srv/camg/data")
    ap.add_argument("--cache", default=os.environ.get("CAMG_CACHE") or "/var/cache/camg-test")
    ap.add_argument(
        "--coding-demo", required=True, help="the Coding demo set (tasks.jsonl, mirrors/)"
    )
    args = ap.parse_args(argv)
    result = prepare_data(Path(args.data), Path(args.cache), Path(args.coding_demo))
    print(json.dumps({k: str(v) for k, v in result.items()}, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
