"""Image manifests, indexes and configs, parsed strictly enough to trust.

Registries hand us JSON written by many tools, so unknown fields are
tolerated (the formats are extensible), but every field we act on is
checked and every bad value names the image it came from.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from camg.errors import DatasetError
from tools.oci.digest import check_digest, sha256_bytes

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"

MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
CONFIG_TYPES = (OCI_CONFIG, DOCKER_CONFIG)

# Layer media types -> compression. zstd is refused rather than guessed at:
# the standard library cannot decompress it.
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": None,
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": None,
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}


@dataclasses.dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    architecture: str
    os: str
    diff_ids: tuple[str, ...]
    env: tuple[str, ...]
    working_dir: str
    user: str


def _load(raw: bytes, what: str) -> dict:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise DatasetError(f"{what}: expected a JSON object")
    return doc


def _descriptor(value: Any, what: str) -> Descriptor:
    if not isinstance(value, dict):
        raise DatasetError(f"{what}: expected a descriptor object")
    media_type, size = value.get("mediaType"), value.get("size")
    if not isinstance(media_type, str):
        raise DatasetError(f"{what}.mediaType: expected a string")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise DatasetError(f"{what}.size: expected a non-negative integer")
    return Descriptor(media_type, check_digest(value.get("digest"), f"{what}.digest"), size)


def media_type_of(raw: bytes, what: str) -> str:
    """The media type a manifest or index declares (or implies, for old Docker indexes)."""
    doc = _load(raw, what)
    media_type = doc.get("mediaType")
    if media_type is None and "manifests" in doc:
        return OCI_INDEX
    if media_type is None and "layers" in doc:
        return OCI_MANIFEST
    if not isinstance(media_type, str):
        raise DatasetError(f"{what}: manifest has no mediaType")
    return media_type


def verify_bytes(raw: bytes, digest: str, what: str) -> None:
    actual = sha256_bytes(raw)
    if actual != digest:
        raise DatasetError(f"{what}: content digest {actual} does not match {digest}")


def select_platform(raw: bytes, what: str, os_name: str = "linux",
                    architecture: str = "amd64") -> str:
    """The digest of the manifest an index lists for this platform."""
    doc = _load(raw, what)
    entries = doc.get("manifests")
    if not isinstance(entries, list):
        raise DatasetError(f"{what}: index has no manifests list")
    for i, entry in enumerate(entries):
        desc = _descriptor(entry, f"{what}.manifests[{i}]")
        platform = entry.get("platform") or {}
        if platform.get("os") == os_name and platform.get("architecture") == architecture:
            if desc.media_type not in MANIFEST_TYPES:
                raise DatasetError(f"{what}: {os_name}/{architecture} entry has media type "
                                   f"{desc.media_type}, not an image manifest")
            return desc.digest
    raise DatasetError(f"{what}: index lists no {os_name}/{architecture} image")


def parse_manifest(raw: bytes, what: str) -> Manifest:
    doc = _load(raw, what)
    if doc.get("schemaVersion") != 2:
        raise DatasetError(f"{what}: schemaVersion must be 2 (schema 1 manifests are refused)")
    media_type = doc.get("mediaType", OCI_MANIFEST)
    if media_type not in MANIFEST_TYPES:
        raise DatasetError(f"{what}: media type {media_type!r} is not an image manifest")
    config = _descriptor(doc.get("config"), f"{what}.config")
    if config.media_type not in CONFIG_TYPES:
        raise DatasetError(f"{what}.config: media type {config.media_type!r} is not an image config")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise DatasetError(f"{what}.layers: expected a non-empty list")
    descs = tuple(_descriptor(v, f"{what}.layers[{i}]") for i, v in enumerate(layers))
    for i, desc in enumerate(descs):
        if desc.media_type not in LAYER_TYPES:
            raise DatasetError(f"{what}.layers[{i}]: unsupported layer media type {desc.media_type!r}")
    return Manifest(media_type, config, descs)


def parse_config(raw: bytes, what: str) -> ImageConfig:
    doc = _load(raw, what)
    rootfs = doc.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers":
        raise DatasetError(f"{what}.rootfs: expected type 'layers'")
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list):
        raise DatasetError(f"{what}.rootfs.diff_ids: expected a list")
    diff_ids = tuple(check_digest(d, f"{what}.rootfs.diff_ids[{i}]") for i, d in enumerate(diff_ids))
    inner = doc.get("config") or {}
    if not isinstance(inner, dict):
        raise DatasetError(f"{what}.config: expected an object")
    env = inner.get("Env") or []
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        raise DatasetError(f"{what}.config.Env: expected a list of NAME=value strings")
    working_dir = inner.get("WorkingDir") or ""
    user = inner.get("User") or ""
    if not isinstance(working_dir, str) or not isinstance(user, str):
        raise DatasetError(f"{what}.config: WorkingDir and User must be strings")
    architecture, os_name = doc.get("architecture"), doc.get("os")
    if not isinstance(architecture, str) or not isinstance(os_name, str):
        raise DatasetError(f"{what}: architecture and os must be strings")
    return ImageConfig(architecture, os_name, diff_ids, tuple(env), working_dir, user)
