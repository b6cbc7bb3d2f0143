"""The two image files: the list to prepare and the materialized result.

images.json (input; environments/coding/data/images.json is the product list)::

    {"version": 1,
     "images": [{"name": "camg/demo-apispec-6.8.1",
                 "repository": "127.0.0.1:5000/camg/demo-apispec",
                 "digest": "sha256:<64 hex>",
                 "workspace": "/testbed"}]}

``name`` is what task rows call the image (their ``image_name``);
``repository`` is a registry reference without tag or digest; the digest is
the only thing pulled (tags are never trusted).

materialized-images.json (output of scripts/prepare_images.py, built with
tools/oci/)::

    {"version": 1, "hash": "sha256:...", "images": [MaterializedImage...]}
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from pathlib import Path

from camg import atomic
from camg.config.hashing import check_digest, sha256_json
from camg.errors import ConfigError, PreparationMissing
from camg.typed import parse, to_json

FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_REPOSITORY = re.compile(
    r"[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)+|[a-z0-9][a-z0-9._/-]*"
)
PREPARE_STEP = "python scripts/prepare_images.py --cache-root DIR --output materialized-images.json"


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    name: str
    repository: str
    digest: str
    workspace: str = "/testbed"

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} is not a valid image name")
        if not _REPOSITORY.fullmatch(self.repository):
            raise ValueError(
                f"repository {self.repository!r} is not a registry reference "
                "(lowercase, no tag or digest)"
            )
        check_digest(self.digest, f"image {self.name}: digest", ValueError)
        if (
            not self.workspace.startswith("/")
            or posixpath.normpath(self.workspace) != self.workspace
            or self.workspace == "/"
        ):
            raise ValueError(
                f"workspace {self.workspace!r} must be a normalized absolute path below /"
            )


@dataclasses.dataclass(frozen=True)
class ImageList:
    version: int
    images: tuple[ImageSpec, ...]


@dataclasses.dataclass(frozen=True)
class MaterializedImage:
    name: str
    repository: str
    digest: str
    config_digest: str
    diff_ids: tuple[str, ...]
    rootfs: str
    workspace: str
    env: tuple[str, ...]
    working_dir: str
    setuid_policy: str
    # What the Coding service puts in /metadata for this image: it changes
    # whenever anything that decides the sandbox's file system changes.
    hash: str

    @property
    def reference(self) -> str:
        """repository@digest, as outcome records name an episode's image."""
        return f"{self.repository}@{self.digest}"


@dataclasses.dataclass(frozen=True)
class MaterializedList:
    version: int
    hash: str
    images: tuple[MaterializedImage, ...]


def load_specs(path: str | Path) -> tuple[ImageSpec, ...]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: image list not found") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    listing = parse(ImageList, doc, str(path), ConfigError)
    if listing.version != FORMAT_VERSION:
        raise ConfigError(f"{path}.version: expected {FORMAT_VERSION}")
    seen: set[str] = set()
    for spec in listing.images:
        if spec.name in seen:
            raise ConfigError(f"{path}: image name {spec.name!r} is listed twice")
        seen.add(spec.name)
    return listing.images


def with_registry(repository: str, registry: str | None) -> str:
    """``repository`` with its registry host replaced by (or prefixed with) ``registry``."""
    if not registry:
        return repository
    first, _, rest = repository.partition("/")
    has_host = rest and ("." in first or ":" in first or first == "localhost")
    return f"{registry}/{rest if has_host else repository}"


def image_hash(
    name: str,
    digest: str,
    config_digest: str,
    diff_ids: tuple[str, ...],
    workspace: str,
    setuid_policy: str,
    applier_version: int,
) -> str:
    return sha256_json(
        {
            "name": name,
            "digest": digest,
            "config_digest": config_digest,
            "diff_ids": list(diff_ids),
            "workspace": workspace,
            "setuid_policy": setuid_policy,
            "applier_version": applier_version,
        }
    )


def write_materialized(path: str | Path, images: tuple[MaterializedImage, ...]) -> MaterializedList:
    listing = MaterializedList(FORMAT_VERSION, sha256_json([i.hash for i in images]), images)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, to_json(listing), indent=2)
    return listing


def load_materialized(path: str | Path) -> MaterializedList:
    """Read materialized-images.json and check every rootfs is still in place."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PreparationMissing(
            f"{path}: materialized image list not found", step=PREPARE_STEP
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    listing = parse(MaterializedList, doc, str(path), ConfigError)
    if listing.hash != sha256_json([i.hash for i in listing.images]):
        raise ConfigError(f"{path}: hash does not match its images")
    for image in listing.images:
        marker = Path(image.rootfs).parent / "complete.json"
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise PreparationMissing(
                f"image {image.name}: materialized rootfs {image.rootfs} is missing or incomplete",
                step=PREPARE_STEP,
            ) from None
        # The marker beside the tree names its digest; the path it recorded
        # is where the cache was seen when it was applied, maybe elsewhere.
        if recorded.get("digest") != image.digest:
            raise PreparationMissing(
                f"image {image.name}: {image.rootfs} holds another image", step=PREPARE_STEP
            )
    return listing


def by_name(listing: MaterializedList) -> dict[str, MaterializedImage]:
    return {image.name: image for image in listing.images}
