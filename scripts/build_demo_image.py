#!/usr/bin/env python3
"""Build the demo OCI image (Debian bookworm + apispec 6.8.1's test venv) and publish it.

    python scripts/build_demo_image.py --cache-root DIR --registry HOST:PORT --output OUTDIR
        [--materialize materialized-images.json] [--flavor plain|swesmith]

--flavor swesmith builds the image laid out like SWE-smith's (the repository
cloned at /testbed, installed editable into /opt/miniconda3/envs/testbed,
activated with `source /opt/miniconda3/bin/activate; conda activate testbed`);
see tools/oci_demo.py.

Run as root (debootstrap, chroot). Every step is cached under DIR/demo.
Writes OUTDIR/images.json (the demo image by digest; its digest is known
only now) and OUTDIR/build.json; then materialize it with

    python scripts/prepare_images.py --cache-root DIR --images OUTDIR/images.json \\
        --output materialized-images.json --skopeo skopeo

or in the same run with ``--materialize PATH`` (the same pull-back by
digest). Without ``--registry`` a throwaway docker-registry on loopback
serves the push and the pull-back (then ``--materialize`` is required).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from camg.errors import CamgError  # noqa: E402
from camg.oci.images import write_materialized  # noqa: E402
from tools import oci_demo as demo  # noqa: E402
from tools.oci.prepare import prepare_images  # noqa: E402
from tools.oci.pull import SkopeoPuller  # noqa: E402
from tools.loopback_registry import LocalRegistry  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-root", required=True, type=Path)
    parser.add_argument("--registry", help="HOST:PORT of the registry to push to")
    parser.add_argument("--materialize", type=Path, metavar="PATH",
                        help="also pull the image back and write materialized-images.json here")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--skopeo", default="skopeo")
    parser.add_argument("--flavor", choices=sorted(demo.FLAVORS), default="plain")
    args = parser.parse_args(argv)
    if args.registry is None and args.materialize is None:
        parser.error("without --registry the image lives only for this run: give --materialize")
    started = time.monotonic()
    try:
        build = demo.build_demo(args.cache_root, args.flavor)
        with contextlib.ExitStack() as stack:
            registry = args.registry
            if registry is None:
                state = stack.enter_context(tempfile.TemporaryDirectory(prefix="camg-registry."))
                registry = stack.enter_context(LocalRegistry(Path(state))).address
            spec = demo.publish(build, registry, skopeo=args.skopeo)
            if args.materialize is not None:
                (image,) = prepare_images([spec], args.cache_root, SkopeoPuller(args.skopeo))
                write_materialized(args.materialize, (image,))
    except CamgError as exc:
        print(f"build_demo_image: {exc.name}: {exc}", file=sys.stderr)
        return 2
    images = demo.write_images_file(args.output / "images.json", spec)
    (args.output / "build.json").write_text(json.dumps({
        "name": spec.name, "repository": spec.repository, "digest": build.digest,
        "layout": str(build.layout), "layers": [layer.to_json() for layer in build.layers],
    }, indent=2) + "\n")
    print(f"build_demo_image: {spec.repository}@{build.digest} -> {images} "
          f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
