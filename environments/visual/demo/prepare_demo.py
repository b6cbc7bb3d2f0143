"""Everything the Visual demo serves, prepared in one step (root).

    python -m environments.visual.demo.prepare_demo --data /srv/camg/data/visual \\
        --lower-root /var/lib/camg/oci-rootfs --registry 127.0.0.1:5000 [--cache DIR]

1. the renderer tree under ``--lower-root`` (one of the helper's lower_roots);
2. the CDN mirror (npm registry) under ``<data>/cdn-mirror``;
3. the demo tasks (briefs, reference sites, oracle.json) under ``<data>/demo``;
4. the demo task image, built from Debian + PyPI packages and pushed to
   ``--registry``; its digest ref goes to ``<data>/images.json`` (the helper's
   allowed-images manifest format: ``{"images": [ref]}``);
5. ``python -m camg.prepare --environment visual`` -> ``<data>/manifest.json``.

Prints the manifest path. Each step is cached and idempotent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from camg.errors import CamgError


def prepare(data: Path, lower_root: Path, registry: str, cache: Path) -> Path:
    from environments.visual.build import cdn_mirror, renderer_rootfs
    from environments.visual.demo import demo_image, demo_tasks
    from environments.visual.prepare import prepare_visual

    data.mkdir(parents=True, exist_ok=True)
    renderer = renderer_rootfs.ensure_renderer_rootfs(lower_root)
    mirror = cdn_mirror.build_mirror(data / "cdn-mirror")
    rows = demo_tasks.build(data / "demo")
    layout_dir, tag, digest = demo_image.build(cache)
    ref = demo_image.publish(layout_dir, tag, digest, registry)
    (data / "images.json").write_text(json.dumps({"images": [ref]}, indent=1) + "\n")
    out = data / "manifest.json"
    prepare_visual(
        rows_path=rows,
        renderer=renderer,
        cdn_mirror=mirror,
        output=out,
        image=ref,
        references=data / "demo" / "reference",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m environments.visual.demo.prepare_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--lower-root", type=Path, required=True)
    ap.add_argument("--registry", required=True, help="host:port of the loopback registry")
    ap.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("CAMG_CACHE") or "/var/cache/camg-test")
    )
    args = ap.parse_args(argv)
    try:
        print(prepare(args.data, args.lower_root, args.registry, args.cache))
    except (CamgError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
