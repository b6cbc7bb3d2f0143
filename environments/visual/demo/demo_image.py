"""The Visual demo's task image: the suite's Debian demo base plus /workspace for the agent.

Upstream's webdev image (``…:webdev-rl-opensource``) carries node 20 and npm;
camg's demo image is built only from Debian and PyPI packages: the demo base
of tools.oci_demo (debootstrap bookworm with python3, git, patch,
ca-certificates, and a test venv) and one small layer holding
``/workspace/dist`` owned by the agent uid 2000. Enough for an agent to write
a static site with bash or python3. The container's command is
``sleep infinity`` (the service sets it); all work arrives as execs.

    layout_dir, tag, digest = build(cache_root)
    ref = publish(layout_dir, tag, digest, "127.0.0.1:5000")   # REPO@sha256:HEX
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from camg.config.hashing import sha256_json
from camg.errors import DatasetError
from tools import oci_demo
from tools.oci import layout

REPOSITORY = "camg/visual-webdev"
TAG = "demo"
AGENT_UID = 2000


def build(cache_root: Path) -> tuple[Path, str, str]:
    """The OCI layout (cached by the base's digest): (layout dir, tag, digest)."""
    base = oci_demo.build_demo(Path(cache_root) / "oci")
    key = sha256_json({"base": base.digest, "v": 1}).split(":", 1)[1][:16]
    out = Path(cache_root) / "visual" / "image" / f"{TAG}-{key}"
    digest_file = out / "digest"
    if digest_file.is_file():
        return out / "layout", TAG, digest_file.read_text().strip()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stage = out / "stage"
    for path in (stage / "workspace", stage / "workspace" / "dist"):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, AGENT_UID, AGENT_UID)
        os.chmod(path, 0o755)
    workspace_layer = layout.layer_from_tree(stage, out / "workspace-layer.tar.gz")
    shutil.rmtree(stage)
    layers = (*base.layers, workspace_layer)
    config = layout.image_config(
        layers,
        env=oci_demo.ENV,
        working_dir="/workspace",
        labels={"org.opencontainers.image.title": f"{REPOSITORY}:{TAG}"},
        history=(
            "debootstrap bookworm (tools.oci_demo)",
            "testbed venv (tools.oci_demo)",
            "/workspace/dist for uid 2000",
        ),
    )
    digest = layout.write_layout(out / "layout", layers, config, TAG)
    digest_file.write_text(digest + "\n")
    return out / "layout", TAG, digest


def publish(
    layout_dir: Path, tag: str, digest: str, registry: str, *, skopeo: str = "skopeo"
) -> str:
    repository = f"{registry}/{REPOSITORY}"
    served = layout.push(layout_dir, tag, repository, skopeo=skopeo)
    if served != digest:
        raise DatasetError(f"registry {registry} serves {served} for {tag}, built {digest}")
    return f"{repository}@{digest}"
