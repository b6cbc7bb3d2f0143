#!/usr/bin/env python3
"""Prepare the demo data of the demo deployment (packaging/demo-deployment.json).

    prepare_demo.py --data /srv/camg/data --images-root /var/lib/camg/oci-rootfs \\
        --cache /var/cache/camg --helper-socket /run/camg/helper.sock \
        [--environments coding,shop] [--deployment-template T --deployment-out D]

Run by packaging/install.sh as root, with a helper listening on
--helper-socket (the demo task set is found by running apispec's suite in
real sandboxes). Every expensive step is content-keyed and cached: the demo
image build under IMAGES_ROOT/demo, the demo task set under CACHE/coding, so
a second install does no build at all.

Coding (what the demo deployment's settings name):
  IMAGES_ROOT/images/<digest>/rootfs      the materialized demo image (a helper lower root)
  DATA/coding/materialized-images.json    the image listing the service verifies (the
                                          SWE-smith-shaped demo image, tools/oci_demo.py)
  DATA/coding/demo/{tasks.parquet,mirrors/}  the task rows and their git mirrors
  DATA/coding/rows-swesmith.jsonl         those rows as served from that image
  DATA/coding/manifest.json               camg.prepare's manifest (task layers under
                                          /var/lib/camg/task-layers/coding)

Shop (the embedded WebShop 1k catalog):
  DATA/shop/java                          Conda-style JAVA_HOME over Debian's openjdk-17
  DATA/shop/{product_pool.json,index/,manifest.json,settings.json}  camg.prepare_shop's output

With --deployment-out, the demo deployment is written there: the template's
entries for the prepared environments, each with the settings its
preparation recorded merged in (Shop's pool and index hashes change with
every index build, so they cannot be written in the template).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from camg.errors import CamgError

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
    from tools import oci_demo as demo
    from camg.oci.images import write_materialized
    from daemons.coding.prepare import prepare_coding as prepare_manifest
    from tools.coding.demo_tasks import fetch_sdist
    from tools.coding.sandbox_runner import ensure_demo_set

    from tools.coding.swesmith_demo import rewrite_rows

    out = data / "coding"
    out.mkdir(parents=True, exist_ok=True)
    # The task set is found with the plain image; it is served from the image
    # laid out like SWE-smith's (clone at /testbed, conda-style activation,
    # SWE-smith's own test command), as real SWE-smith tasks are.
    image = demo.ensure_demo_image(images_root)
    served = demo.ensure_demo_image(images_root, flavor="swesmith")
    images_json = out / "materialized-images.json"
    write_materialized(images_json, (served.image,))
    built = ensure_demo_set(cache / "coding", image.image, helper_socket, fetch_sdist(cache / "coding" / "sdist"))
    # The cache may be shared or pruned; the service reads its own copy.
    demo_set = out / "demo"
    if not _same_tree(built, demo_set):
        staging = out / ".demo.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(built, staging, symlinks=True)
        shutil.rmtree(demo_set, ignore_errors=True)
        staging.rename(demo_set)
    manifest = out / "manifest.json"
    rows = out / "rows-swesmith.jsonl"
    rewrite_rows(demo_set / "tasks.jsonl", rows)
    prepare_manifest(rows_path=rows, mirrors_root=demo_set / "mirrors",
                     images_path=images_json, output=manifest)
    # The service (User=camg) reads all of it; nothing here is secret.
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return manifest


def prepare_shop(data: Path, images_root: Path, cache: Path, helper_socket: str) -> Path:
    from daemons.shop import prepare as shop
    from daemons.shop import javahome

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
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return out / "manifest.json"


PREPARERS = {"coding": prepare_coding, "shop": prepare_shop}


def write_deployment(template: Path, output: Path, data: Path, names: list[str]) -> None:
    body = json.loads(template.read_text())
    body["environments"] = {name: entry for name, entry in body["environments"].items()
                            if name in names}
    for name, entry in body["environments"].items():
        recorded = data / name / "settings.json"
        if recorded.is_file():
            entry["settings"] = {**json.loads(recorded.read_text()), **entry.get("settings", {})}
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(output)


def demo_names(requested: str) -> list[str]:
    """``all``: the registered environments (camg.plugins) with demo data,
    in registry order; otherwise the names given."""
    if requested != "all":
        return [n for n in requested.split(",") if n]
    from camg import plugins

    registered = list(plugins.all_plugins())
    for name in registered:
        if name not in PREPARERS:
            print(f"prepare_demo: {name}: registered, but has no demo data yet; not served",
                  file=sys.stderr)
    return [n for n in registered if n in PREPARERS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--images-root", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--helper-socket", required=True)
    parser.add_argument("--environments", default="all",
                        help=f"comma-separated, of: {', '.join(PREPARERS)}; 'all': every "
                             "registered environment that has demo data")
    parser.add_argument("--deployment-template", type=Path,
                        help="packaging/demo-deployment.json")
    parser.add_argument("--deployment-out", type=Path,
                        help="write the demo deployment for the prepared environments here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (image rootfs and task layers are root-owned)")
    names = demo_names(args.environments)
    unknown = sorted(set(names) - set(PREPARERS))
    if unknown:
        parser.error(f"no demo preparation for: {', '.join(unknown)}")
    try:
        for name in names:
            started = time.monotonic()
            print(f"prepare_demo: {name}: preparing the demo data", file=sys.stderr, flush=True)
            result = PREPARERS[name](args.data, args.images_root, args.cache, args.helper_socket)
            print(f"prepare_demo: {name}: {result} ({time.monotonic() - started:.0f}s)",
                  file=sys.stderr, flush=True)
        if args.deployment_out:
            write_deployment(args.deployment_template, args.deployment_out, args.data, names)
    except CamgError as exc:
        print(f"prepare_demo: {exc.name}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
