"""Prepare images: pull by digest, verify, materialize, or reuse the verified cache."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from camg.errors import ConfigError
from camg.oci.images import ImageSpec, MaterializedImage, image_hash, with_registry
from tools.oci import cache
from tools.oci.apply import ApplyOptions
from tools.oci.pull import CranePuller, Puller, SkopeoPuller, pull_verified

log = logging.getLogger("tools.oci")


def choose_puller(*, skopeo: str | None, crane: str | None, insecure: bool) -> Puller:
    """skopeo when asked for; crane when given and runnable; else skopeo from PATH.

    The seed documents ``--crane``, but crane is not packaged for Debian:
    the puller only transports bytes that are verified afterwards, so
    falling back to skopeo changes nothing that is recorded.
    """
    if skopeo:
        return SkopeoPuller(_executable(skopeo, "--skopeo"), insecure)
    if crane and shutil.which(crane):
        return CranePuller(shutil.which(crane), insecure)
    found = shutil.which("skopeo")
    if found is None:
        raise ConfigError(f"no puller: crane {crane!r} is not executable and skopeo is not on PATH")
    if crane:
        log.warning("crane %r is not executable; pulling with %s", crane, found)
    return SkopeoPuller(found, insecure)


def _executable(path: str, flag: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise ConfigError(f"{flag} {path!r} is not an executable")
    return found


def _record(spec: ImageSpec, marker: dict, repository: str, cache_root: Path) -> MaterializedImage:
    diff_ids = tuple(marker["diff_ids"])
    # The rootfs as this machine sees the cache (marker_matches says why).
    rootfs = str(cache.image_dir(cache_root, spec.digest) / "rootfs")
    return MaterializedImage(
        name=spec.name, repository=repository, digest=spec.digest,
        config_digest=marker["config_digest"], diff_ids=diff_ids, rootfs=rootfs,
        workspace=spec.workspace, env=tuple(marker["env"]), working_dir=marker["working_dir"],
        setuid_policy=marker["setuid_policy"],
        hash=image_hash(spec.name, spec.digest, marker["config_digest"], diff_ids, spec.workspace,
                        marker["setuid_policy"], marker["applier_version"]))


def prepare_image(spec: ImageSpec, cache_root: Path, puller: Puller, *, registry: str | None = None,
                  options: ApplyOptions | None = None) -> tuple[MaterializedImage, bool]:
    """Materialize one image (or reuse it); returns (record, reused).

    Call under ``cache.locked(cache_root)``.
    """
    options = options or default_options()
    repository = with_registry(spec.repository, registry)
    marker = cache.read_marker(cache_root, spec.digest)
    if cache.marker_matches(marker, cache_root, spec.digest, options):
        return _record(spec, marker, repository, cache_root), True
    with cache.work_dir(cache_root, spec.digest) as work:
        verified = pull_verified(puller, repository, spec.digest, spec.name, work / "pull")
        final = cache.materialize(cache_root, work, verified, options,
                                  {"name": spec.name, "repository": repository})
    marker = cache.read_marker(cache_root, spec.digest)
    assert marker is not None and marker["rootfs"] == str(final / "rootfs")
    return _record(spec, marker, repository, cache_root), False


def default_options(setuid: str = "keep") -> ApplyOptions:
    # Ownership from the tar headers needs root; unprivileged runs (unit
    # tests, dry runs) materialize with the caller as owner.
    return ApplyOptions(setuid=setuid, chown=os.geteuid() == 0)


def prepare_images(specs: Iterable[ImageSpec], cache_root: Path, puller: Puller, *,
                   registry: str | None = None,
                   options: ApplyOptions | None = None) -> tuple[MaterializedImage, ...]:
    cache_root = Path(cache_root).absolute()
    results = []
    with cache.locked(cache_root):
        for spec in specs:
            record, reused = prepare_image(spec, cache_root, puller, registry=registry, options=options)
            log.info("image %s %s: %s", spec.name, spec.digest, "reused" if reused else "materialized")
            results.append(record)
    return tuple(results)
