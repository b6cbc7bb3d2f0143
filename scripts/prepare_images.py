#!/usr/bin/env python3
"""Pull the Coding environment's images by digest and materialize their root filesystems.

    python scripts/prepare_images.py --cache-root DIR --crane PATH \\
        --output materialized-images.json [--images environments/coding/data/images.json] \\
        [--registry HOST:PORT] [--skopeo PATH] [--insecure-registry] [--setuid-policy keep|strip]
        [--helper-config /etc/camg/helper.json]

Every blob is verified against its digest and every layer against the
config's diff_ids; a verified cached image is reused. Run as root (the
rootfs keeps the ownership its layers record). The demo image's digest is
known only after scripts/build_demo_image.py ran: pass the images.json that
script wrote (``--images OUTDIR/images.json``). The cache root must be below
one of the helper's ``lower_roots`` (its config file, --helper-config): the
helper mounts no rootfs from anywhere else, so any other root is refused
before anything is pulled.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from camg.sandboxes import helper_roots  # noqa: E402
from camg.errors import CamgError  # noqa: E402
from camg.oci.images import load_specs, write_materialized  # noqa: E402
from tools.oci.prepare import choose_puller, default_options, prepare_images  # noqa: E402

DEFAULT_IMAGES = (Path(__file__).resolve().parent.parent / "environments" / "coding" / "data"
                  / "images.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-root", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    parser.add_argument("--crane", help="crane executable (used when runnable and --skopeo is not given)")
    parser.add_argument("--skopeo", help="skopeo executable: pull with skopeo")
    parser.add_argument("--registry", help="HOST:PORT replacing each repository's registry")
    parser.add_argument("--insecure-registry", action="store_true",
                        help="plain HTTP / no TLS verification (implied for loopback registries)")
    parser.add_argument("--setuid-policy", choices=("keep", "strip"), default="keep")
    parser.add_argument("--helper-config", default=helper_roots.DEFAULT_HELPER_CONFIG,
                        help="the helper's config file, whose lower_roots must hold "
                             "--cache-root (default %(default)s; unreadable: a warning)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        helper_roots.check_lower(args.cache_root, "--cache-root",
                                 helper_roots.load(args.helper_config))
        specs = load_specs(args.images)
        puller = choose_puller(skopeo=args.skopeo, crane=args.crane, insecure=args.insecure_registry)
        images = prepare_images(specs, args.cache_root, puller, registry=args.registry,
                                options=default_options(args.setuid_policy))
        listing = write_materialized(args.output, images)
    except CamgError as exc:
        print(f"prepare_images: {exc.name}: {exc}", file=sys.stderr)
        return 2
    print(f"prepare_images: {len(images)} image(s) ready, hash {listing.hash} -> {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
