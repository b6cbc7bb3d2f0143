"""The materialized-image cache: one verified root filesystem per manifest digest.

Layout under the cache root::

    lock                         flock held by whoever changes the cache
    tmp/<hex>.<random>/          work in progress (pull/, rootfs/, marker)
    images/<manifest hex>/       complete: rootfs/ and complete.json

An image directory appears only by renaming a finished work directory, so
``images/<hex>`` either holds a fully verified rootfs with its marker or
does not exist. The marker records what was verified (manifest, config and
layer digests, diff_ids) and how it was applied (applier version, setuid
policy, ownership); a marker that disagrees with the request means the
image is materialized again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ctypes
import fcntl
import gzip
import json
import os
import secrets
import shutil
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from camg.config import progress
from camg.errors import DatasetError
from tools.oci.apply import ApplyOptions, LayerStats, apply_layer
from tools.oci.digest import HashingReader, hex_of

# Bump when the applier's output for the same layers changes.
APPLIER_VERSION = 1
MARKER = "complete.json"


@dataclasses.dataclass(frozen=True)
class VerifiedImage:
    """What the puller fetched, every blob already checked against its digest."""

    name: str
    digest: str
    config_digest: str
    diff_ids: tuple[str, ...]
    layers: tuple[tuple[str, str, Path], ...]  # (digest, compression or "", path)
    env: tuple[str, ...]
    working_dir: str


def image_dir(cache_root: Path, digest: str) -> Path:
    return cache_root / "images" / hex_of(digest)


@contextlib.contextmanager
def locked(cache_root: Path) -> Iterator[None]:
    """Serialize cache writers; stale work directories are swept under the lock."""
    cache_root.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_root, 0o755)
    fd = os.open(cache_root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tmp = cache_root / "tmp"
        if tmp.is_dir():
            for stale in tmp.iterdir():
                _rmtree(stale)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def work_dir(cache_root: Path, digest: str) -> Iterator[Path]:
    """A fresh work directory, removed on the way out whatever happened."""
    path = cache_root / "tmp" / f"{hex_of(digest)}.{secrets.token_hex(6)}"
    path.mkdir(parents=True, mode=0o700)
    try:
        yield path
    finally:
        _rmtree(path)


def _rmtree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass


def read_marker(cache_root: Path, digest: str) -> dict | None:
    try:
        with open(image_dir(cache_root, digest) / MARKER, encoding="utf-8") as handle:
            marker = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def marker_matches(marker: dict | None, cache_root: Path, digest: str, options: ApplyOptions) -> bool:
    """Whether the entry of ``digest`` is complete and applied as ``options`` ask.

    The tree is looked for beside the marker, not at the path the marker
    recorded: one cache is seen at other paths by other machines (the system
    tier's guests bind the host's cache at /var/cache/camg), and a
    recorded-path check made each side re-apply the other's entry in place,
    under the sandboxes using it."""
    if marker is None:
        return False
    return (marker.get("digest") == digest
            and marker.get("applier_version") == APPLIER_VERSION
            and marker.get("setuid_policy") == options.setuid
            and marker.get("chown") == options.chown
            and isinstance(marker.get("diff_ids"), list)
            and (image_dir(cache_root, digest) / "rootfs").is_dir())


def _apply_blob(root_fd: int, image: VerifiedImage, index: int, options: ApplyOptions) -> LayerStats:
    digest, compression, path = image.layers[index]
    expected = image.diff_ids[index]
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
        hashed = HashingReader(stream)
        try:
            with tarfile.open(fileobj=hashed, mode="r|") as tar:
                stats = apply_layer(root_fd, tar, image=image.name, layer=digest, options=options)
            hashed.drain()
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise DatasetError(f"image {image.name}: layer {digest} is not a valid tar stream ({exc})",
                               image=image.name, layer=digest) from None
    if hashed.digest != expected:
        raise DatasetError(f"image {image.name}: layer {digest} uncompresses to {hashed.digest}, "
                           f"but the config's diff_ids[{index}] is {expected}",
                           image=image.name, layer=digest)
    return stats


def materialize(cache_root: Path, work: Path, image: VerifiedImage, options: ApplyOptions,
                record: dict) -> Path:
    """Apply every layer into ``work``/image/rootfs and publish it atomically; returns the image dir.

    ``record`` is merged into the marker (name, repository, workspace...).
    On any error nothing is published; ``work`` is the caller's to remove.
    """
    staged = work / "image"
    staged.mkdir(mode=0o755)
    rootfs = staged / "rootfs"
    rootfs.mkdir(mode=0o755)
    os.chmod(rootfs, 0o755)
    stats: list[dict] = []
    root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with progress.Progress(f"tools.oci: image {image.name}: applying layers", len(image.layers),
                               "layer") as bar:
            for index in range(len(image.layers)):
                stats.append(dataclasses.asdict(_apply_blob(root_fd, image, index, options)))
                bar.update()
    finally:
        os.close(root_fd)
    final = image_dir(cache_root, image.digest)
    marker = dict(record)
    marker.update({
        "digest": image.digest,
        "config_digest": image.config_digest,
        "layers": [layer[0] for layer in image.layers],
        "diff_ids": list(image.diff_ids),
        "env": list(image.env),
        "working_dir": image.working_dir,
        "applier_version": APPLIER_VERSION,
        "setuid_policy": options.setuid,
        "chown": options.chown,
        "layer_stats": stats,
        "rootfs": str(final / "rootfs"),
    })
    # The marker promises a complete tree, so the tree reaches the disk first.
    _syncfs(staged)
    _write_durably(staged / MARKER, json.dumps(marker, indent=2, sort_keys=True).encode())
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        # An outdated entry: move it aside into the work dir, which is removed anyway.
        os.rename(final, work / "outdated")
    os.rename(staged, final)
    _fsync_dir(final.parent)
    return final


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs {path}")
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_image(cache_root: Path, digest: str) -> None:
    """Idempotent removal of one materialized image."""
    with locked(cache_root):
        _rmtree(image_dir(cache_root, digest))


def cached_digests(cache_root: Path) -> Sequence[str]:
    images = cache_root / "images"
    if not images.is_dir():
        return ()
    return tuple(sorted("sha256:" + p.name for p in images.iterdir()))

