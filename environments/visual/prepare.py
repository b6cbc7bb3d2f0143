"""``python -m camg.prepare --environment visual``: webdev rows -> prepared manifest.

    python -m camg.prepare --environment visual --rows webdev.jsonl \\
        --image REGISTRY/REPO@sha256:HEX  (or --image-map map.json) \\
        --renderer /var/lib/camg/oci-rootfs/visual-renderer-KEY \\
        --cdn-mirror /srv/camg/data/visual/cdn-mirror/mirror.json \\
        --output /srv/camg/data/visual/manifest.json [--select ids.txt] [--limit N]

Rows are MiMo webdev instances, one JSON object a line, either bare or as
NeMo-Gym rows (``{"instance": {...}}``): ``instance_id``, ``problem_statement``,
``cwd`` (default /workspace), ``docker_image``, ``dataset_type`` "webdev".
Upstream's bare image names are mapped to images pinned by digest (one
``--image`` for all rows, as upstream's single webdev image, or a JSON map
name -> ref). Ids and order are kept (the --select file's order, else the
rows'). The manifest records the rows file, the renderer's renderer.json and
the mirror's mirror.json by hash; configure re-hashes them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.errors import CamgError, DatasetError
from environments.visual import reference

CREATED_BY = "camg.prepare 0.1.0 (visual)"
_DIGEST_REF = re.compile(r"[^\s@]+@sha256:[0-9a-f]{64}")
_CWD = re.compile(r"/[A-Za-z0-9._/-]*")


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"{path}:{lineno}: not JSON: {exc}") from None
            inst = row.get("instance", row) if isinstance(row, dict) else None
            if not isinstance(inst, dict):
                raise DatasetError(f"{path}:{lineno}: a row must be a JSON object")
            rows.append(_validate(inst, f"{path}:{lineno}"))
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


def _validate(inst: dict, where: str) -> dict:
    iid = inst.get("instance_id") or inst.get("task_id")
    if not isinstance(iid, str) or not iid or "/" in iid or not iid.isprintable():
        raise DatasetError(f"{where}: field instance_id: missing or invalid")
    if inst.get("dataset_type", "webdev") != "webdev":
        raise DatasetError(
            f"{where} ({iid}): field dataset_type: {inst.get('dataset_type')!r} is not webdev"
        )
    brief = inst.get("problem_statement")
    if not isinstance(brief, str) or not brief.strip():
        raise DatasetError(f"{where} ({iid}): field problem_statement: missing or empty")
    cwd = inst.get("cwd", "/workspace")
    if not isinstance(cwd, str) or not _CWD.fullmatch(cwd) or ".." in cwd.split("/"):
        raise DatasetError(f"{where} ({iid}): field cwd: {cwd!r} is not an absolute path")
    image = inst.get("docker_image", "")
    if not isinstance(image, str):
        raise DatasetError(f"{where} ({iid}): field docker_image must be a string")
    return {
        "instance_id": iid,
        "problem_statement": brief,
        "cwd": cwd,
        "docker_image": image,
        "category": str(inst.get("category", "website")),
    }


def prepare_visual(
    *,
    rows_path,
    renderer,
    cdn_mirror,
    output,
    image: str | None = None,
    image_map: str | None = None,
    select=None,
    limit: int | None = None,
    references=None,
) -> dict:
    rows = read_rows(rows_path)
    mapping: dict[str, str] = {}
    if image_map:
        try:
            mapping = json.loads(Path(image_map).read_text())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"--image-map {image_map}: {exc}") from None
    for ref in ([image] if image else []) + list(mapping.values()):
        if not isinstance(ref, str) or not _DIGEST_REF.fullmatch(ref):
            raise DatasetError(f"image {ref!r} is not pinned by digest (REPO@sha256:HEX)")
    by_id = {}
    for row in rows:
        if row["instance_id"] in by_id:
            raise DatasetError(f"{rows_path}: instance_id {row['instance_id']!r} appears twice")
        by_id[row["instance_id"]] = row
    if select is not None:
        wanted = [x.split("#", 1)[0].strip() for x in Path(select).read_text().splitlines()]
        wanted = [x for x in wanted if x]
        missing = [x for x in wanted if x not in by_id]
        if missing:
            raise DatasetError(f"{select}: selected id {missing[0]!r} is not in {rows_path}")
        rows = [by_id[x] for x in wanted]
    if limit is not None:
        if limit < 1:
            raise DatasetError("--limit must be at least 1")
        rows = rows[:limit]
    renderer_json = Path(renderer) / "renderer.json"
    if not renderer_json.is_file() or not (Path(renderer) / "rootfs").is_dir():
        raise DatasetError(
            f"{renderer} is not a renderer tree "
            "(build it: python -m environments.visual.build.renderer_rootfs)"
        )
    if not Path(cdn_mirror).is_file():
        raise DatasetError(
            f"{cdn_mirror} is missing (build it: python -m environments.visual.build.cdn_mirror)"
        )
    tasks = []
    for row in rows:
        pinned = mapping.get(row["docker_image"]) or image
        if not pinned:
            raise DatasetError(
                f"task {row['instance_id']}: no pinned image for "
                f"{row['docker_image']!r} (give --image or --image-map)"
            )
        data = dict(row, image=pinned, dataset_type="webdev")
        site = reference.load(references, row["instance_id"]) if references is not None else None
        if site is not None:  # served only where the deployment enables references
            data["reference"] = site
        tasks.append({"task_id": row["instance_id"], "data": data})
    sampling = {"order": "select" if select else "rows", "limit": limit}
    body = manifest.build(
        "visual",
        tasks,
        sampling=sampling,
        files={"rows": rows_path, "renderer": renderer_json, "cdn_mirror": cdn_mirror},
        created_by=CREATED_BY,
    )
    manifest.write(output, body)
    return body


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m camg.prepare --environment visual",
        description="Prepare a Visual task manifest for camg.configure.",
    )
    ap.add_argument("--rows", required=True, help="webdev rows (.jsonl)")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--image", help="REPO@sha256:HEX used for every row")
    group.add_argument("--image-map", help="JSON map: row docker_image -> REPO@sha256:HEX")
    ap.add_argument("--renderer", required=True, help="visual-renderer-KEY directory")
    ap.add_argument(
        "--cdn-mirror", required=True, help="mirror.json of environments.visual.build.cdn_mirror"
    )
    ap.add_argument("--output", required=True)
    ap.add_argument("--select")
    ap.add_argument("--limit", type=int)
    ap.add_argument(
        "--references",
        help="reference sites, DIR/<task_id>/index.html... (for camg_client --policy oracle)",
    )
    args = ap.parse_args(argv)
    try:
        body = prepare_visual(
            rows_path=args.rows,
            renderer=args.renderer,
            cdn_mirror=args.cdn_mirror,
            output=args.output,
            image=args.image,
            image_map=args.image_map,
            select=args.select,
            limit=args.limit,
            references=args.references,
        )
    except (CamgError, OSError) as exc:
        print(f"camg.prepare: {exc}", file=sys.stderr)
        return 2
    print(f"camg.prepare: wrote {args.output} with {len(body['tasks'])} visual task(s)")
    return 0
