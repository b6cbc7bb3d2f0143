"""The Coding demo's data: the task set found in real sandboxes, served
from the SWE-smith-shaped demo image.

What the plugin's ``demo_prepare`` names (camg.plugins), run by
packaging/prepare_demo.py as root: takes (DATA, CACHE, helper socket) and
returns the manifest it wrote.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tools import demo_data


def built_demo_set(cache: Path, helper_socket: str) -> Path:
    """The demo task set found with the plain demo image (CACHE/oci) in real
    sandboxes of ``helper_socket``, built once under CACHE/coding."""
    from environments.coding.demo.demo_tasks import fetch_sdist
    from environments.coding.demo.sandbox_runner import ensure_demo_set
    from tools import oci_demo as demo

    image = demo.ensure_demo_image(cache / "oci")
    return ensure_demo_set(
        cache / "coding", image.image, helper_socket, fetch_sdist(cache / "coding" / "sdist")
    )


def find_demo_set(data: Path, cache: Path, helper_socket: str) -> Path:
    """DATA/coding/demo (tasks.jsonl, mirrors/): the built set, copied."""
    out = data / "coding"
    out.mkdir(parents=True, exist_ok=True)
    built = built_demo_set(cache, helper_socket)
    # The cache may be shared or pruned; the service reads its own copy.
    demo_set = out / "demo"
    if not demo_data.same_tree(built, demo_set):
        staging = out / ".demo.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(built, staging, symlinks=True)
        shutil.rmtree(demo_set, ignore_errors=True)
        staging.rename(demo_set)
    return demo_set


def prepare(data: Path, cache: Path, helper_socket: str) -> Path:
    from camg.oci.images import write_materialized
    from environments.coding.demo.swesmith_demo import rewrite_rows
    from environments.coding.prepare import prepare_coding as prepare_manifest
    from tools import oci_demo as demo

    out = data / "coding"
    # The task set is found with the plain image; it is served from the image
    # laid out like SWE-smith's (clone at /testbed, conda-style activation,
    # SWE-smith's own test command), as real SWE-smith tasks are.
    demo_set = find_demo_set(data, cache, helper_socket)
    served = demo.ensure_demo_image(cache / "oci", flavor="swesmith")
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (served.image,))
    manifest = out / "manifest.json"
    rows = out / "rows-swesmith.jsonl"
    rewrite_rows(demo_set / "tasks.jsonl", rows)
    # With its impossible variants, each validated inverted in grader
    # sandboxes (served only on request: the demo's canary_fraction is 0);
    # one task's own validation sampled, every other task's gold fix graded
    # by its variants'. What a grade proved is kept beside the layers: a
    # second run grades nothing again.
    prepare_manifest(
        rows_path=rows,
        mirrors_root=demo_set / "mirrors",
        images_path=images_json,
        output=manifest,
        validate=True,
        sample=1,
        seed=0,
        variants=True,
        helper_socket=helper_socket,
    )
    demo_data.readable(out)
    return manifest
