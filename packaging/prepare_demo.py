#!/usr/bin/env python3
"""Prepare the demo data of the demo deployment (packaging/demo-deployment.json).

    prepare_demo.py --data /srv/camg/data --images-root /var/lib/camg/oci-rootfs \\
        --cache /var/cache/camg --helper-socket /run/camg/helper.sock [--environments coding]

Run by packaging/install.sh as root, with a helper listening on
--helper-socket (the demo task set is found by running apispec's suite in
real sandboxes). Every expensive step is content-keyed and cached: the demo
image build under IMAGES_ROOT/demo, the demo task set under CACHE/coding, so
a second install does no build at all.

Coding (what the demo deployment's settings name):
  IMAGES_ROOT/images/<digest>/rootfs      the materialized demo image (a helper lower root)
  DATA/coding/materialized-images.json    the image listing the service verifies
  DATA/coding/demo/{tasks.parquet,mirrors/}  the task rows and their git mirrors
  DATA/coding/manifest.json               camg.prepare's manifest (task layers under
                                          /var/lib/camg/task-layers/coding)
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

from camg.errors import CamgError

SDIST = "apispec==6.8.1"


def _sdist(cache: Path) -> Path:
    target = cache / "coding" / "sdist"
    path = target / "apispec-6.8.1.tar.gz"
    if not path.is_file():
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", SDIST, "-d", str(target)], check=True)
    return path


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


def prepare_coding(data: Path, images_root: Path, cache: Path, helper_socket: str) -> Path:
    from camg.oci import demo
    from camg.oci.images import write_materialized
    from camg.prepare import prepare_coding as prepare_manifest
    from daemons.coding.sandbox_runner import ensure_demo_set

    out = data / "coding"
    out.mkdir(parents=True, exist_ok=True)
    image = demo.ensure_demo_image(images_root)
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (image.image,))
    built = ensure_demo_set(cache / "coding", image.image, helper_socket, _sdist(cache))
    # The cache may be shared or pruned; the service reads its own copy.
    demo_set = out / "demo"
    if not _same_tree(built, demo_set):
        staging = out / ".demo.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(built, staging, symlinks=True)
        shutil.rmtree(demo_set, ignore_errors=True)
        staging.rename(demo_set)
    manifest = out / "manifest.json"
    prepare_manifest(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                     images_path=images_json, output=manifest)
    # The service (User=camg) reads all of it; nothing here is secret.
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return manifest


PREPARERS = {"coding": prepare_coding}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--images-root", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--helper-socket", required=True)
    parser.add_argument("--environments", default="coding",
                        help=f"comma-separated, of: {', '.join(PREPARERS)}")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (image rootfs and task layers are root-owned)")
    names = [n for n in args.environments.split(",") if n]
    unknown = sorted(set(names) - set(PREPARERS))
    if unknown:
        parser.error(f"no demo preparation for: {', '.join(unknown)}")
    try:
        for name in names:
            result = PREPARERS[name](args.data, args.images_root, args.cache, args.helper_socket)
            print(f"prepare_demo: {name}: {result}", file=sys.stderr)
    except CamgError as exc:
        print(f"prepare_demo: {exc.name}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
