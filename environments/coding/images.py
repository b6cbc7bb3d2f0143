"""Which materialized image rootfs a task runs on.

The list is scripts/prepare_images.py's materialized-images.json (read by
camg.oci.images). Rows name an image by ``image_name``; SWE-smith rows use
``swesmith.x86_64.<owner>__<repo>.<c8>`` while the published image is
``swebench/swesmith.x86_64.<owner>_1776_<repo>.<c8>`` (Docker Hub forbids
``__``), so the image list may carry either spelling.
"""

from __future__ import annotations

from pathlib import Path

from camg.errors import ConfigError, DatasetError
from camg.oci.images import MaterializedImage, MaterializedList, by_name, load_materialized


def load(path: str | Path) -> MaterializedList:
    return load_materialized(path)


def lookup(catalog: MaterializedList, image_name: str) -> MaterializedImage:
    images = by_name(catalog)
    hub = image_name.replace("__", "_1776_")
    for candidate in (
        image_name,
        f"swebench/{image_name}",
        hub,
        f"swebench/{hub}",
        image_name.split(":", 1)[0],
    ):
        if candidate in images:
            return images[candidate]
    raise DatasetError(
        f"image {image_name!r} is not materialized (known: {', '.join(sorted(images)) or 'none'})",
        field="image_name",
    )


def verify(catalog: MaterializedList, recorded: dict) -> MaterializedImage:
    """At service start: the image a task was prepared with is still the one on disk."""
    try:
        image = lookup(catalog, recorded["name"])
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    if image.digest != recorded["digest"] or image.hash != recorded["hash"]:
        raise ConfigError(
            f"image {recorded['name']!r} changed since preparation "
            f"(recorded {recorded['digest']}, now {image.digest})"
        )
    if image.workspace != "/testbed":
        raise ConfigError(f"image {image.name!r}: workspace {image.workspace} is not /testbed")
    return image
