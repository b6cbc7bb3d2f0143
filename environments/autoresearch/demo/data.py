"""The AutoResearch demo's data: the research image, the task bundles, and
the packages, workspaces and private answers roots.

What the plugin's ``demo_prepare`` names (camg.plugins), run by
packaging/prepare_demo.py as root: takes (DATA, CACHE, helper socket) and
returns the manifest it wrote.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tools import demo_data

STATE = Path("/var/lib/camg")
AR_PACKAGES = STATE / "autoresearch-tasks"
AR_WORKSPACES = STATE / "task-layers" / "autoresearch"
AR_PRIVATE = Path("/var/lib/camg-grader/answers")


def _tree_key(*paths: Path) -> str:
    from camg.config.hashing import sha256_json

    return sha256_json([[str(p), p.read_text()] for p in paths]).split(":", 1)[1][:16]


def prepare(data: Path, cache: Path, helper_socket: str) -> Path:
    from camg.oci.images import write_materialized
    from environments.autoresearch import metrics
    from environments.autoresearch.demo import demo_tasks, image
    from environments.autoresearch.prepare import prepare

    out = data / "autoresearch"
    out.mkdir(parents=True, exist_ok=True)
    research = image.ensure_image(cache / "oci")
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (research.image,))
    # The bundles (scikit-learn's data, the synthetic segmentation images, the baseline
    # and reference scores measured here) are keyed by the code that makes them.
    bundles = (
        cache
        / "autoresearch"
        / f"bundles-{_tree_key(Path(demo_tasks.__file__), Path(metrics.__file__))}"
    )
    if not (bundles / "done").is_file():
        shutil.rmtree(bundles, ignore_errors=True)
        demo_tasks.build(bundles)
        (bundles / "done").write_text("")
    # The packages and workspaces roots are made private by the preparation
    # itself. The answers' parent: the grader's uid passes through it to its
    # own 0700 answers; nobody lists it.
    AR_PRIVATE.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(AR_PRIVATE.parent, 0o711)
    manifest = out / "manifest.json"
    prepare(
        source=bundles,
        packages_root=AR_PACKAGES,
        workspaces_root=AR_WORKSPACES,
        private_root=AR_PRIVATE,
        images=images_json,
        image_name=image.NAME,
        output=manifest,
        grader_user="camg-grader",
    )
    demo_data.readable(out)
    return manifest
