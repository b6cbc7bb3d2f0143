"""``python -m camg.prepare --environment coding``: SWE-smith rows -> prepared manifest.

    python -m camg.prepare --environment coding --rows tasks.parquet \\
        --mirrors-root /srv/camg/data/coding/mirrors \\
        --images /srv/camg/data/coding/materialized-images.json \\
        --output /srv/camg/data/coding/manifest.json \\
        [--select ids.txt] [--limit N] [--seed S] [--layers-root DIR | --no-layers]
        [--validate [--sample N] [--variants] [--helper-socket SOCK]] [--helper-config PATH]

Every row is validated (a bad row names its index, instance_id and field),
the selection keeps the ids and the order given (the --select file's order,
else the rows file's), every task's mirror branch is resolved and its
commits recorded, every image_name must be materialized, and the task
layers are built (as root) so that no episode ever builds one. The manifest
records the rows file and the materialized-images file by hash. The layers
root and every image rootfs a task uses must be below the helper's
``lower_roots`` (its config file, --helper-config): the helper would refuse
them at the first reset, so preparation refuses them first.

``--variants`` (with ``--validate``) also makes each selected task's
impossible variants (environments/coding/mutations.py: one ``one_off`` and
one ``conflicting`` mutation of a FAIL_TO_PASS test), builds their grader
layers (environments/coding/prepare_variants.py) and validates every one of
them inverted: the gold fix and the no-op must fail it, the gold fix pass
the task. Those that hold are written to the manifest's ``variants``
(camg.config.variants), the others dropped and counted in ``sampling``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from camg.config import progress
from camg.config import task_manifest as manifest
from camg.errors import CamgError, DatasetError
from camg.sandboxes import helper_roots
from environments.coding import images as images_mod
from environments.coding import layers, mirrors, profiles
from environments.coding import rows as rows_mod
from environments.coding.prepare_layers import build_layers_as_root

CREATED_BY = "camg.prepare 0.1.0"
DEFAULT_LAYERS_ROOT = "/var/lib/camg/task-layers/coding"


def read_selection(path: str | Path) -> list[str]:
    """Ids, one per line, in the order to serve them ('#' comments allowed)."""
    ids: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            value = line.split("#", 1)[0].strip()
            if not value:
                continue
            if value in seen:
                raise DatasetError(f"{path}:{lineno}: id {value!r} is selected twice")
            seen.add(value)
            ids.append(value)
    if not ids:
        raise DatasetError(f"{path}: selects no task")
    return ids


def prepare_coding(
    *,
    rows_path: str | Path,
    mirrors_root: str | Path,
    images_path: str | Path,
    output: str | Path,
    select: str | Path | None = None,
    limit: int | None = None,
    seed: int | None = None,
    layers_root: str | Path | None = DEFAULT_LAYERS_ROOT,
    validate: bool = False,
    sample: int | None = None,
    helper_socket: str | None = None,
    helper_config: str | Path | None = None,
    variants: bool = False,
) -> dict:
    """Validate, select, resolve and write the manifest; return its body.

    ``helper_config``: the helper's config file whose lower_roots must hold
    the layers root and the tasks' image rootfs (None: not checked; the
    command line checks /etc/camg/helper.json unless told otherwise).

    ``validate``: also grade gold and no-op of every task (or of a seeded
    ``sample``) in sandboxes and refuse, naming them, the tasks whose gold
    is not 1.0 or whose no-op is not 0.0 (environments.coding.validate).

    ``variants`` (needs ``validate``): the selected tasks' impossible
    variants, made, built and validated inverted; those that hold are
    written to the manifest.
    """
    from camg.config.hashing import sha256_file

    raw = rows_mod.read(rows_path)
    checked = [rows_mod.validate(r, i) for i, r in enumerate(raw)]
    by_id: dict[str, rows_mod.Row] = {}
    for index, row in enumerate(checked):
        if row.instance_id in by_id:
            raise DatasetError(
                f"row {index} ({row.instance_id!r}): field instance_id: "
                "appears twice in the rows file",
                row=index,
                field="instance_id",
            )
        by_id[row.instance_id] = row
    if select is not None:
        wanted = read_selection(select)
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise DatasetError(f"{select}: selected id {missing[0]!r} is not in {rows_path}")
        chosen = [by_id[i] for i in wanted]
    else:
        chosen = checked
    if limit is not None:
        if limit < 1:
            raise DatasetError("--limit must be at least 1")
        chosen = chosen[:limit]

    refs = mirrors.resolve(mirrors_root, chosen)
    for row in chosen:
        profiles.for_repo(row.repo)
    catalog = images_mod.load(images_path)
    if variants and not validate:
        raise DatasetError(
            "--variants needs --validate: a variant is served only once the gold fix "
            "and the no-op are proved to fail it"
        )
    if validate and layers_root is None:
        raise DatasetError(
            "--validate grades in sandboxes over the task layers: "
            "it cannot be combined with --no-layers"
        )
    if helper_config is not None:
        _check_lowers(helper_config, layers_root, catalog, chosen)
    tasks = []
    built_layers = {}
    bar = progress.Progress("coding: task layers", len(chosen), "task")
    for row, ref in zip(chosen, refs, strict=True):
        image = images_mod.lookup(catalog, row.image_name)
        if layers_root is not None:
            built_layers[row.instance_id] = build_layers_as_root(
                layers_root, ref, image_rootfs=image.rootfs, image_key=image.hash
            )
        bar.update()
        data = row.to_data()
        data["mirror"] = ref.to_data()
        data["image"] = {"name": image.name, "digest": image.digest, "hash": image.hash}
        tasks.append({"task_id": row.instance_id, "data": data})
    bar.close()
    sampling: dict[str, object] = {
        "order": "select" if select is not None else "rows",
        "seed": seed,
        "limit": limit,
        "select_sha256": sha256_file(select) if select is not None else None,
    }
    kept_variants: list = []
    if validate:
        sampling["validation"] = _validate(
            chosen,
            refs,
            catalog,
            built_layers,
            mirrors_root,
            images_path,
            layers_root,
            sample,
            seed,
            helper_socket,
        )
    if variants:
        assert layers_root is not None  # validate needs the layers: checked above
        validation_body = sampling["validation"]
        assert isinstance(validation_body, dict)  # _validate's
        kept_variants, sampling["variants"] = _variants(
            chosen,
            refs,
            catalog,
            built_layers,
            mirrors_root,
            images_path,
            layers_root,
            helper_socket,
            validation_body["results"],
        )
    body = manifest.build(
        "coding",
        tasks,
        sampling=sampling,
        files={"rows": rows_path, "images": images_path},
        created_by=CREATED_BY,
        variants=kept_variants,
    )
    manifest.write(output, body)
    return body


def _check_lowers(helper_config, layers_root, catalog, chosen) -> None:
    """Before building anything: every lower a task's sandbox will mount is
    where the helper accepts lowers."""
    roots = helper_roots.load(helper_config)
    if layers_root is not None:
        helper_roots.check_lower(layers_root, "--layers-root", roots)
    for name in dict.fromkeys(row.image_name for row in chosen):
        image = images_mod.lookup(catalog, name)
        helper_roots.check_lower(
            image.rootfs,
            "--cache-root of scripts/prepare_images.py or tools.prepare_image",
            roots,
            what=f"image {image.name} rootfs",
        )


def _validate(
    chosen,
    refs,
    catalog,
    built_layers,
    mirrors_root,
    images_path,
    layers_root,
    sample,
    seed,
    helper_socket,
) -> dict:
    from camg.config.hashing import sha256_json
    from camg.helper_client import DEFAULT_SOCKET
    from environments.coding import validate as validation
    from environments.coding.episode import Prepared
    from environments.coding.settings import Settings

    ids = validation.sample([r.instance_id for r in chosen], sample, seed)
    by_id = {row.instance_id: (row, ref) for row, ref in zip(chosen, refs, strict=True)}
    prepared = []
    for task_id in ids:
        row, ref = by_id[task_id]
        image = images_mod.lookup(catalog, row.image_name)
        prepared.append(
            Prepared(row, ref, image, built_layers[task_id], profiles.for_repo(row.repo))
        )
    settings = Settings(
        mirrors_root=str(Path(mirrors_root).resolve()),
        images=str(Path(images_path).resolve()),
        layers_root=str(Path(layers_root).resolve()),
    )
    results = validation.validate(prepared, settings, helper_socket or DEFAULT_SOCKET)
    validation.refuse_bad(results)
    return {
        "sample": sample,
        "validated": len(results),
        "of": len(chosen),
        "grader": sha256_json({"guard": layers.guard_digest(), "created_by": CREATED_BY}),
        "results": {r.task_id: r.to_data() for r in results},
    }


def _variants(
    chosen,
    refs,
    catalog,
    built_layers,
    mirrors_root,
    images_path,
    layers_root,
    helper_socket,
    validated: dict,
) -> tuple[list, dict]:
    """The impossible variants that hold, and what ``sampling`` says of them."""
    import dataclasses

    from camg.helper_client import DEFAULT_SOCKET
    from environments.coding import prepare_variants
    from environments.coding import validate as validation
    from environments.coding.episode import Prepared
    from environments.coding.settings import Settings

    task_images = [images_mod.lookup(catalog, row.image_name) for row in chosen]
    built, without = prepare_variants.make(layers_root, chosen, refs, task_images)
    origins = {
        row.instance_id: Prepared(
            row, ref, image, built_layers[row.instance_id], profiles.for_repo(row.repo)
        )
        for row, ref, image in zip(chosen, refs, task_images, strict=True)
    }
    settings = Settings(
        mirrors_root=str(Path(mirrors_root).resolve()),
        images=str(Path(images_path).resolve()),
        layers_root=str(Path(layers_root).resolve()),
    )
    origin_gold = {k: v["gold"] for k, v in validated.items() if v.get("gold") is not None}
    results = validation.validate_variants(
        built, origins, settings, helper_socket or DEFAULT_SOCKET, origin_gold
    )
    kept = []
    dropped = {}
    for made, result in zip(built, results, strict=True):
        if result.ok:
            data = {**made.variant.data, "validation": result.to_data()}
            kept.append(dataclasses.replace(made.variant, data=data))
        else:
            dropped[made.variant.variant_id] = result.problem or str(result.to_data())
    by_type: dict[str, int] = {}
    for variant in kept:
        by_type[variant.mutation["type"]] = by_type.get(variant.mutation["type"], 0) + 1
    summary = {
        "made": len(built),
        "kept": len(kept),
        "by_type": by_type,
        "dropped": dropped,
        "tasks_without": sorted(without),
    }
    return kept, summary


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m camg.prepare --environment coding",
        description="Prepare a task manifest for camg.configure.",
    )
    ap.add_argument("--rows", required=True, help="SWE-smith rows (.parquet or .jsonl)")
    ap.add_argument("--mirrors-root", required=True)
    ap.add_argument("--images", required=True, help="materialized-images.json")
    ap.add_argument("--output", required=True)
    ap.add_argument("--select", help="file of instance ids to serve, in order")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--seed", type=int)
    layers_group = ap.add_mutually_exclusive_group()
    layers_group.add_argument(
        "--layers-root",
        default=DEFAULT_LAYERS_ROOT,
        help=f"where task layers are built (default {DEFAULT_LAYERS_ROOT})",
    )
    layers_group.add_argument(
        "--no-layers",
        action="store_true",
        help="skip building task layers (the service builds them as root)",
    )
    ap.add_argument(
        "--validate",
        action="store_true",
        help="grade gold and no-op per task in sandboxes; refuse bad tasks",
    )
    ap.add_argument("--sample", type=int, help="with --validate: validate N tasks (seeded)")
    ap.add_argument(
        "--variants",
        action="store_true",
        help="with --validate: make each task's impossible variants (a mutated "
        "FAIL_TO_PASS test), validate them inverted, keep those that hold",
    )
    ap.add_argument("--helper-socket", help="with --validate: the camg-helper socket")
    ap.add_argument(
        "--helper-config",
        default=helper_roots.DEFAULT_HELPER_CONFIG,
        help="the helper's config file, whose lower_roots must hold the layers "
        "root and the images (default %(default)s; unreadable: a warning)",
    )
    args = ap.parse_args(argv)
    if args.sample is not None and not args.validate:
        ap.error("--sample needs --validate")
    if args.variants and not args.validate:
        ap.error("--variants needs --validate")
    try:
        body = prepare_coding(
            rows_path=args.rows,
            mirrors_root=args.mirrors_root,
            images_path=args.images,
            output=args.output,
            select=args.select,
            limit=args.limit,
            seed=args.seed,
            layers_root=None if args.no_layers else args.layers_root,
            validate=args.validate,
            sample=args.sample,
            helper_socket=args.helper_socket,
            helper_config=args.helper_config,
            variants=args.variants,
        )
    except (CamgError, OSError) as exc:
        print(f"camg.prepare: {exc}", file=sys.stderr)
        return 2
    checked = body["sampling"].get("validation")
    note = f", {checked['validated']} validated (gold 1.0, no-op 0.0)" if checked else ""
    made = body["sampling"].get("variants")
    if made:
        note += (
            f", {made['kept']} of {made['made']} impossible variant(s) kept "
            "(gold and no-op fail each)"
        )
    print(f"camg.prepare: wrote {args.output} with {len(body['tasks'])} coding task(s){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
