"""Build a repository's SWE-smith-shaped image from Debian and PyPI packages: no Docker engine, no Docker Hub.

    python -m tools.prepare_image --spec SPEC.json --cache-root DIR --output OUTDIR \\
        [--materialize materialized-images.json] [--registry HOST:PORT] [--skopeo PATH] \\
        [--helper-config /etc/camg/helper.json]

SPEC.json is the builder's spec (tools/oci/build.py; an example:
environments/coding/demo/parse.json): the repository (a PyPI sdist, or a
git repository here at a commit) and SWE-smith's profile fields (python,
pip_packages pinned, install_cmds, test_cmd). The image is built, cached
under DIR/demo, as the project's own OCI layout, and its digest written to
OUTDIR/images.json (the image list scripts/prepare_images.py and
camg.oci.images read) with OUTDIR/build.json (layout, layers, the sdist and
/testbed's commit, the spec). ``--materialize PATH`` also applies it under
DIR/images/ (every blob verified against its digest, as a pull is) and
writes materialized-images.json for ``camg.prepare --images``; DIR must then
be below one of the helper's lower_roots, checked before anything is built.
Nothing is published unless ``--registry`` is given: then the image is
pushed there (skopeo), checked by digest, and materialized from it.

Run as root (debootstrap, chroot). Why this is ``tools.prepare_image`` and
not ``camg.prepare_image``: camg/ imports nothing of tools/, where image
building lives (see tools/oci/build.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from camg.sandboxes import helper_roots
from camg.errors import CamgError, ConfigError, DatasetError
from camg.oci.images import FORMAT_VERSION, ImageSpec, write_materialized
from tools.oci import build as builder
from tools.oci import layout
from tools.oci.prepare import default_options, prepare_images
from tools.oci.pull import LayoutPuller, SkopeoPuller

#: the repository's host when the image is not published: never pulled from
#: a registry (materialized straight from the layout), and never Docker Hub
LOCAL_HOST = "localhost"


def prepare(spec: builder.ImageBuildSpec, cache_root: Path, output: Path, *,
            materialize: Path | None = None, registry: str | None = None,
            skopeo: str = "skopeo") -> dict:
    """Build (cached), optionally publish and materialize; write the image
    files; return build.json's body."""
    build = builder.build_image(spec, cache_root)
    repository = f"{registry or LOCAL_HOST}/{spec.repository}"
    image_spec = ImageSpec(name=spec.name, repository=repository, digest=build.digest,
                           workspace=builder.WORKSPACE)
    if registry is not None:
        served = layout.push(build.layout, build.tag, repository, skopeo=skopeo)
        if served != build.digest:
            raise DatasetError(f"image {spec.name}: registry {registry} serves {served}, "
                               f"built {build.digest}")
    if materialize is not None:
        puller = SkopeoPuller(skopeo) if registry is not None else LayoutPuller(build.layout)
        images = prepare_images([image_spec], cache_root, puller, options=default_options())
        write_materialized(materialize, images)
    output.mkdir(parents=True, exist_ok=True)
    (output / "images.json").write_text(json.dumps(
        {"version": FORMAT_VERSION, "images": [vars(image_spec)]}, indent=2) + "\n")
    record = builder.build_record(spec, build, repository)
    (output / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.prepare_image",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help="the image spec (JSON)")
    parser.add_argument("--cache-root", required=True, type=Path,
                        help="build cache; with --materialize, also the materialized rootfs")
    parser.add_argument("--output", required=True, type=Path,
                        help="directory for images.json and build.json")
    parser.add_argument("--materialize", type=Path, metavar="PATH",
                        help="also materialize the image and write materialized-images.json here")
    parser.add_argument("--registry", help="HOST:PORT to publish the image to (only if asked)")
    parser.add_argument("--skopeo", default="skopeo", help="skopeo executable (with --registry)")
    parser.add_argument("--helper-config", default=helper_roots.DEFAULT_HELPER_CONFIG,
                        help="the helper's config file, whose lower_roots must hold --cache-root "
                             "when materializing (default %(default)s; unreadable: a warning)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    started = time.monotonic()
    try:
        spec = builder.load_spec(args.spec)
        if args.materialize is not None:
            helper_roots.check_lower(args.cache_root, "--cache-root",
                                     helper_roots.load(args.helper_config))
        if os.geteuid() != 0:
            raise ConfigError("run as root: the build uses debootstrap and chroot")
        record = prepare(spec, args.cache_root, args.output, materialize=args.materialize,
                         registry=args.registry, skopeo=args.skopeo)
    except CamgError as exc:
        print(f"prepare_image: {exc.name}: {exc}", file=sys.stderr)
        return 2
    print(f"prepare_image: {record['repository']}@{record['digest']} -> "
          f"{args.output / 'images.json'}"
          + (f", {args.materialize}" if args.materialize else "")
          + f" ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
