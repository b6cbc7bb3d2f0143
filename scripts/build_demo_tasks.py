#!/usr/bin/env python3
"""Build the demo Coding task set (SWE-smith style) from apispec 6.8.1's sdist.

    python scripts/build_demo_tasks.py --output DIR [--sdist apispec-6.8.1.tar.gz]
        [--python /venv/bin/python | --helper-socket SOCK --rootfs DIR] [--count 12] [--seed 0]

Writes DIR/mirrors/<owner>__apispec.<commit8>/ (one branch per task),
DIR/tasks.jsonl, DIR/tasks.parquet and DIR/build-info.json. With --images
(materialized-images.json) and --manifest it then runs camg.prepare on the
result, so one command yields the demo's prepared manifest. Without --sdist
the sdist is fetched with `pip download --no-deps --no-binary :all:`.
Tests run either with a local interpreter holding apispec's test
dependencies (--python) or, as the service will run them, in a helper sandbox
over the materialized demo image (--helper-socket and --rootfs).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from camg.errors import CamgError  # noqa: E402
from camg.config.hashing import sha256_file  # noqa: E402
from environments.coding.demo import demo_tasks  # noqa: E402

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--sdist", type=Path)
    parser.add_argument("--python", type=Path, help="local interpreter with apispec's test deps")
    parser.add_argument("--helper-socket", help="run the suite in helper sandboxes")
    parser.add_argument("--rootfs", help="materialized demo image rootfs (with --helper-socket)")
    parser.add_argument("--image-name", default=demo_tasks.DemoSpec.image_name)
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", help="materialized-images.json: also prepare a manifest")
    parser.add_argument("--manifest", help="where to write the prepared manifest (with --images)")
    parser.add_argument("--layers-root", default="/var/lib/camg/task-layers/coding")
    parser.add_argument("--swesmith-rows", type=Path,
                        help="also write the rows served from the SWE-smith-shaped demo image "
                             "(scripts/build_demo_image.py --flavor swesmith) here")
    args = parser.parse_args(argv)
    if bool(args.images) != bool(args.manifest):
        parser.error("--images and --manifest go together")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sdist = args.sdist or demo_tasks.fetch_sdist(args.output.parent / "sdist")
        if args.helper_socket:
            from environments.coding.demo.sandbox_runner import sandbox_runner
            if not args.rootfs:
                parser.error("--helper-socket needs --rootfs")
            runner = sandbox_runner(args.helper_socket, args.rootfs)
            how = {"runner": "sandbox", "rootfs": args.rootfs}
        elif args.python:
            runner = demo_tasks.local_runner(args.python)
            how = {"runner": "local", "python": str(args.python)}
        else:
            parser.error("give --python or --helper-socket/--rootfs")
        spec = demo_tasks.DemoSpec(sdist=sdist, image_name=args.image_name, count=args.count,
                                   seed=args.seed)
        rows = demo_tasks.build(spec, args.output, runner)
        jsonl, parquet = demo_tasks.write_rows(rows, args.output)
        if args.swesmith_rows:
            from environments.coding.demo.swesmith_demo import rewrite_rows
            rewrite_rows(jsonl, args.swesmith_rows)
        info = {"sdist": str(sdist), "sdist_sha256": sha256_file(sdist), "seed": args.seed,
                "count": len(rows), **how,
                "mirror": str(next((args.output / "mirrors").iterdir())),
                "rows_jsonl": str(jsonl), "rows_parquet": str(parquet)}
        (args.output / "build-info.json").write_text(json.dumps(info, indent=1) + "\n")
        if args.images:
            from environments.coding.prepare import prepare_coding
            prepare_coding(rows_path=parquet, mirrors_root=args.output / "mirrors",
                           images_path=args.images, output=args.manifest,
                           layers_root=args.layers_root)
            info["manifest"] = str(Path(args.manifest).resolve())
    except CamgError as exc:
        print(f"build_demo_tasks: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
