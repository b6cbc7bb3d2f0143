"""General's task images: Debian + PyPI layers, one small task layer per task.

Every image shares the demo base (tools.oci_demo: a debootstrap bookworm
rootfs with python3 and git, and /opt/testbed-venv holding apispec's test
dependencies from PyPI) and adds one task layer:

* ``/opt/mimo-task`` (root, 0700): the task as the transport reads it --
  ``instance.json`` + ``workspace.tar`` for opensource-code, the whole task
  directory (workspace, tools, system state, rubric) for general_agent;
* ``/home/arena-agent`` owned by the agent uid 2000; ``/work``, ``/logs``.

The transport itself and its Python come from the agent environment the
helper mounts read-only at /opt/camg/agent-env (environments.general.build.agent_env).
Layouts are cached under ``<cache>/general/images``; ``publish`` pushes
each to a registry with skopeo and returns ``REPO@sha256:...`` refs, which
the service pulls back by digest through the helper.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from camg.config.hashing import sha256_json, sha256_tree
from camg.errors import DatasetError
from tools import oci_demo
from tools.oci import layout

REPOSITORY = "camg/mimo-general"
TASK_ROOT = "opt/mimo-task"
AGENT_UID = 2000
AGENT_ENV = "/opt/camg/agent-env"
#: the General service's container command (environments.general.environment.transport_command)
COMMAND = (f"{AGENT_ENV}/bin/python", "-m", "mimoagent.transport", "--root", "/" + TASK_ROOT)


def _stage(task_dir: Path, kind: str, stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    root = stage / TASK_ROOT
    root.parent.mkdir(parents=True)
    if kind == "opensource-code":
        root.mkdir(mode=0o700)
        for name in ("instance.json", "workspace.tar"):
            shutil.copyfile(task_dir / name, root / name)
    elif kind == "general_agent":
        shutil.copytree(task_dir, root, symlinks=False)
    else:
        raise DatasetError(f"unknown task kind {kind!r}")
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, 0, 0)
        os.chmod(dirpath, 0o700 if dirpath == str(root) else 0o755)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), 0, 0)
            os.chmod(os.path.join(dirpath, name), 0o644)
    os.chmod(root, 0o700)
    home = stage / "home" / "arena-agent"
    home.mkdir(parents=True)
    os.chown(home, AGENT_UID, AGENT_UID)
    for name in ("work", "logs"):
        (stage / name).mkdir(mode=0o755)


def build_task_image(cache_root: Path, task_dir: Path, kind: str) -> tuple[Path, str, str]:
    """An OCI layout for one task: (layout dir, tag, manifest digest); cached by content."""
    base = oci_demo.build_demo(Path(cache_root) / "oci")
    instance = json.loads((task_dir / "instance.json").read_text())
    # A short tag skopeo's oci: references accept; the instance id is in the labels.
    tag = ("code-" if kind == "opensource-code" else "ga-") + sha256_json(
        instance["instance_id"]
    ).split(":", 1)[1][:12]
    key = sha256_json(
        {"base": base.digest, "task": sha256_tree(task_dir), "kind": kind, "v": 1}
    ).split(":", 1)[1][:16]
    out = Path(cache_root) / "general" / "images" / f"{tag}-{key}"
    digest_file = out / "digest"
    if digest_file.is_file():
        return out / "layout", tag, digest_file.read_text().strip()
    # One builder at a time (CI's lanes share the cache): a waiter finds the digest.
    with oci_demo.locked(out.with_name(f".{out.name}.lock")):
        if digest_file.is_file():
            return out / "layout", tag, digest_file.read_text().strip()
        return _build_task_image(out, base, task_dir, kind, tag, instance)


def _build_task_image(
    out: Path, base, task_dir: Path, kind: str, tag: str, instance: dict
) -> tuple[Path, str, str]:
    digest_file = out / "digest"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stage = out / "stage"
    _stage(task_dir, kind, stage)
    task_layer = layout.layer_from_tree(stage, out / "task-layer.tar.gz")
    shutil.rmtree(stage)
    layers = (*base.layers, task_layer)
    config = layout.image_config(
        layers,
        env=oci_demo.ENV,
        working_dir="/",
        labels={
            "org.opencontainers.image.title": f"{REPOSITORY}:{tag}",
            "io.camg.mimo.kind": kind,
            "io.camg.mimo.instance": instance["instance_id"],
        },
        history=(
            "debootstrap bookworm (tools.oci_demo)",
            "testbed venv (tools.oci_demo)",
            f"task {instance['instance_id']} at /{TASK_ROOT}",
        ),
    )
    digest = layout.write_layout(out / "layout", layers, config, tag)
    digest_file.write_text(digest + "\n")
    return out / "layout", tag, digest


def publish(
    layout_dir: Path, tag: str, digest: str, registry: str, *, skopeo: str = "skopeo"
) -> str:
    repository = f"{registry}/{REPOSITORY}"
    served = layout.push(layout_dir, tag, repository, skopeo=skopeo)
    if served != digest:
        raise DatasetError(f"registry {registry} serves {served} for {tag}, built {digest}")
    return f"{repository}@{digest}"
