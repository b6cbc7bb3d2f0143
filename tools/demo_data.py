"""The demo data of each environment: what its plugin's ``demo_prepare``
names (camg.plugins), run by packaging/prepare_demo.py as root.

Every function takes (DATA, CACHE, helper socket) and returns the manifest
it wrote; packaging/prepare_demo.py's docstring says what each one leaves
under DATA and CACHE.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from camg.errors import CamgError
from camg.host_private import private_dir

STATE = Path("/var/lib/camg")
AR_PACKAGES = STATE / "autoresearch-tasks"
AR_WORKSPACES = STATE / "task-layers" / "autoresearch"
AR_PRIVATE = Path("/var/lib/camg-grader/answers")
DOCKER_SOCKET = "unix:///var/run/docker.sock"


def _same_tree(a: Path, b: Path) -> bool:
    if not b.is_dir():
        return False
    cmp = filecmp.dircmp(a, b)
    stack = [cmp]
    while stack:
        c = stack.pop()
        if c.left_only or c.right_only or c.diff_files or c.funny_files:
            return False
        stack.extend(c.subdirs.values())
    return True


def _readable(path: Path) -> None:
    """The services (User=camg) read all of it, and what goes into a sandbox
    or a task container (General's agent environment, Visual's CDN mirror)
    is read there through its files' "other" bits; but rows, mirrors, gold
    patches, oracle files and references are grading material, so the tree
    itself is root's and the services' only (private_dir)."""
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(path)], check=True)
    private_dir(path)


def coding_demo_set(data: Path, cache: Path, helper_socket: str) -> Path:
    """DATA/coding/demo (tasks.jsonl, mirrors/): found with the plain demo
    image in real sandboxes, cached under CACHE/coding."""
    from tools import oci_demo as demo
    from environments.coding.demo.demo_tasks import fetch_sdist
    from environments.coding.demo.sandbox_runner import ensure_demo_set

    out = data / "coding"
    out.mkdir(parents=True, exist_ok=True)
    image = demo.ensure_demo_image(cache / "oci")
    built = ensure_demo_set(cache / "coding", image.image, helper_socket,
                            fetch_sdist(cache / "coding" / "sdist"))
    # The cache may be shared or pruned; the service reads its own copy.
    demo_set = out / "demo"
    if not _same_tree(built, demo_set):
        staging = out / ".demo.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(built, staging, symlinks=True)
        shutil.rmtree(demo_set, ignore_errors=True)
        staging.rename(demo_set)
    return demo_set


def prepare_coding(data: Path, cache: Path, helper_socket: str) -> Path:
    from tools import oci_demo as demo
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding as prepare_manifest
    from environments.coding.demo.swesmith_demo import rewrite_rows

    out = data / "coding"
    # The task set is found with the plain image; it is served from the image
    # laid out like SWE-smith's (clone at /testbed, conda-style activation,
    # SWE-smith's own test command), as real SWE-smith tasks are.
    demo_set = coding_demo_set(data, cache, helper_socket)
    served = demo.ensure_demo_image(cache / "oci", flavor="swesmith")
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (served.image,))
    manifest = out / "manifest.json"
    rows = out / "rows-swesmith.jsonl"
    rewrite_rows(demo_set / "tasks.jsonl", rows)
    prepare_manifest(rows_path=rows, mirrors_root=demo_set / "mirrors",
                     images_path=images_json, output=manifest)
    _readable(out)
    return manifest


def prepare_shop(data: Path, cache: Path, helper_socket: str) -> Path:
    from environments.shop import prepare as shop
    from environments.shop import javahome

    out = data / "shop"
    java_home = out / "java"
    javahome.build_layout("/usr/lib/jvm/java-17-openjdk-amd64", java_home)
    args = shop.parser().parse_args(["--output", str(out), "--java-home", str(java_home),
                                     "--sample-index-check"])
    try:
        # A verified earlier preparation is kept: Lucene writes random segment
        # ids, so rebuilding would change the index hash on every install.
        shop.verify(args)
    except (CamgError, OSError, ValueError):
        shop.prepare(args)
    _readable(out)
    return out / "manifest.json"


def _pull_into_dockerd(refs: list[str]) -> None:
    """While the loopback registry still serves them: dockerd keeps the
    images by digest after the registry is gone."""
    import docker

    api = docker.APIClient(base_url=DOCKER_SOCKET, timeout=900)
    try:
        for ref in refs:
            for line in api.pull(ref, stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    raise RuntimeError(f"pulling {ref}: {line['error']}")
    finally:
        api.close()


def prepare_general(data: Path, cache: Path, helper_socket: str) -> Path:
    from environments.general.demo import assemble as demo

    demo_set = data / "coding" / "demo"
    if not (demo_set / "tasks.jsonl").is_file():
        demo_set = coding_demo_set(data, cache, helper_socket)
    result = demo.prepare_data(data, cache, demo_set)
    _readable(data / "general")
    return Path(result["manifest"])


def prepare_visual(data: Path, cache: Path, helper_socket: str) -> Path:
    from tools.loopback_registry import LocalRegistry
    from environments.visual.demo import prepare_demo as visual

    out = data / "visual"
    with tempfile.TemporaryDirectory(prefix="camg-visual-registry.") as state, \
            LocalRegistry(Path(state)) as registry:
        manifest = visual.prepare(out, cache / "helper", registry.address, cache)
        refs = json.loads((out / "images.json").read_text())["images"]
        _pull_into_dockerd(refs)
    _readable(out)
    return manifest


def _tree_key(*paths: Path) -> str:
    from camg.hashing import sha256_json

    return sha256_json([[str(p), p.read_text()] for p in paths]).split(":", 1)[1][:16]


def prepare_autoresearch(data: Path, cache: Path, helper_socket: str) -> Path:
    from camg.oci.images import write_materialized
    from environments.autoresearch import metrics
    from environments.autoresearch.prepare import prepare
    from environments.autoresearch.demo import demo_tasks, image

    out = data / "autoresearch"
    out.mkdir(parents=True, exist_ok=True)
    research = image.ensure_image(cache / "oci")
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (research.image,))
    # The bundles (scikit-learn's data, the synthetic segmentation images, the baseline
    # and reference scores measured here) are keyed by the code that makes them.
    bundles = cache / "autoresearch" / f"bundles-{_tree_key(Path(demo_tasks.__file__), Path(metrics.__file__))}"
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
    prepare(source=bundles, packages_root=AR_PACKAGES, workspaces_root=AR_WORKSPACES,
            private_root=AR_PRIVATE, images=images_json, image_name=image.NAME,
            output=manifest, grader_user="camg-grader")
    _readable(out)
    return manifest
