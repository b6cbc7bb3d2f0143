"""Pulling an image by digest with skopeo or crane, and verifying what arrived.

Nothing a puller hands back is trusted: the manifest bytes must hash to the
listed digest, the config and every layer blob to the digests the manifest
names (and have its sizes), and the config must list one diff_id per layer.
The diff_ids themselves are checked while the layers are applied
(tools.oci.cache), where the uncompressed stream is read anyway.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path
from typing import Protocol

from camg.errors import ConfigError, DatasetError
from tools.oci import manifest as mf
from tools.oci.cache import VerifiedImage
from tools.oci.digest import file_digest, hex_of

PULL_TIMEOUT = 3600


@dataclasses.dataclass(frozen=True)
class Pulled:
    manifest: bytes
    blob_dir: Path  # blobs named by their hex digest


class Puller(Protocol):
    def raw_manifest(self, repository: str, digest: str) -> bytes: ...

    def fetch(self, repository: str, digest: str, dest: Path) -> Pulled: ...


def is_loopback(repository: str) -> bool:
    """Loopback registries are plain HTTP, as Docker treats them."""
    host = repository.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run(argv: list[str], what: str, stdout=subprocess.PIPE) -> bytes:
    try:
        proc = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, timeout=PULL_TIMEOUT,
                              check=False)
    except FileNotFoundError:
        raise ConfigError(f"{what}: puller executable {argv[0]!r} not found") from None
    except subprocess.TimeoutExpired:
        raise DatasetError(f"{what}: {os.path.basename(argv[0])} took longer than {PULL_TIMEOUT} s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-2000:]
        raise DatasetError(f"{what}: {os.path.basename(argv[0])} failed (exit {proc.returncode}): {err}")
    return proc.stdout if stdout == subprocess.PIPE else b""


class SkopeoPuller:
    def __init__(self, skopeo: str = "skopeo", insecure: bool = False) -> None:
        self.skopeo = skopeo
        self.insecure = insecure

    def _tls(self, repository: str, flag: str) -> list[str]:
        plain = self.insecure or is_loopback(repository)
        return [f"{flag}={'false' if plain else 'true'}"]

    def raw_manifest(self, repository: str, digest: str) -> bytes:
        ref = f"docker://{repository}@{digest}"
        return _run([self.skopeo, "inspect", "--raw", *self._tls(repository, "--tls-verify"), ref],
                    f"manifest of {repository}@{digest}")

    def fetch(self, repository: str, digest: str, dest: Path) -> Pulled:
        # dir: keeps the registry's manifest bytes; --preserve-digests makes
        # skopeo refuse any conversion that would change them.
        _run([self.skopeo, "copy", "--quiet", "--preserve-digests",
              *self._tls(repository, "--src-tls-verify"),
              f"docker://{repository}@{digest}", f"dir:{dest}"],
             f"pull of {repository}@{digest}", stdout=subprocess.DEVNULL)
        return Pulled((dest / "manifest.json").read_bytes(), dest)


class CranePuller:
    """crane (go-containerregistry) fetches the manifest and each blob itself."""

    def __init__(self, crane: str, insecure: bool = False) -> None:
        self.crane = crane
        self.insecure = insecure

    def _flags(self, repository: str) -> list[str]:
        return ["--insecure"] if self.insecure or is_loopback(repository) else []

    def raw_manifest(self, repository: str, digest: str) -> bytes:
        return _run([self.crane, "manifest", *self._flags(repository), f"{repository}@{digest}"],
                    f"manifest of {repository}@{digest}")

    def fetch(self, repository: str, digest: str, dest: Path) -> Pulled:
        dest.mkdir(parents=True, exist_ok=True)
        raw = self.raw_manifest(repository, digest)
        mf.verify_bytes(raw, digest, f"manifest of {repository}@{digest}")
        parsed = mf.parse_manifest(raw, f"manifest of {repository}@{digest}")
        for desc in (parsed.config, *parsed.layers):
            with open(dest / hex_of(desc.digest), "wb") as out:
                _run([self.crane, "blob", *self._flags(repository), f"{repository}@{desc.digest}"],
                     f"blob {desc.digest} of {repository}", stdout=out)
        return Pulled(raw, dest)


class LayoutPuller:
    """Reads an OCI image layout on this machine (what tools.oci.build
    writes) as a registry would serve it: no registry, no network. The
    repository is only a name here; every blob is verified as any pull's."""

    def __init__(self, layout: Path) -> None:
        self.blobs = Path(layout) / "blobs" / "sha256"

    def _blob(self, digest: str, what: str) -> Path:
        path = self.blobs / hex_of(digest)
        if not path.is_file():
            raise DatasetError(f"{what}: {digest} is not in the layout {self.blobs.parent.parent}")
        return path

    def raw_manifest(self, repository: str, digest: str) -> bytes:
        return self._blob(digest, f"manifest of {repository}").read_bytes()

    def fetch(self, repository: str, digest: str, dest: Path) -> Pulled:
        dest.mkdir(parents=True, exist_ok=True)
        raw = self.raw_manifest(repository, digest)
        mf.verify_bytes(raw, digest, f"manifest of {repository}@{digest}")
        parsed = mf.parse_manifest(raw, f"manifest of {repository}@{digest}")
        for desc in (parsed.config, *parsed.layers):
            source = self._blob(desc.digest, f"blob of {repository}")
            try:
                os.link(source, dest / hex_of(desc.digest))
            except OSError:  # another file system
                shutil.copyfile(source, dest / hex_of(desc.digest))
        return Pulled(raw, dest)


def resolve_digest(puller: Puller, repository: str, digest: str, name: str) -> str:
    """The image manifest digest to pull: ``digest`` itself, or its linux/amd64
    entry when ``digest`` names an index (verified before it is trusted)."""
    raw = puller.raw_manifest(repository, digest)
    what = f"image {name}: manifest {digest}"
    mf.verify_bytes(raw, digest, what)
    if mf.media_type_of(raw, what) in mf.INDEX_TYPES:
        return mf.select_platform(raw, what)
    return digest


def _check_blob(blob_dir: Path, desc: mf.Descriptor, name: str) -> Path:
    path = blob_dir / hex_of(desc.digest)
    if not path.is_file():
        raise DatasetError(f"image {name}: blob {desc.digest} was not fetched", image=name, layer=desc.digest)
    actual, size = file_digest(path)
    if actual != desc.digest:
        raise DatasetError(f"image {name}: blob {desc.digest} has content digest {actual}",
                           image=name, layer=desc.digest)
    if size != desc.size:
        raise DatasetError(f"image {name}: blob {desc.digest} is {size} bytes, the manifest says {desc.size}",
                           image=name, layer=desc.digest)
    return path


def pull_verified(puller: Puller, repository: str, digest: str, name: str, dest: Path) -> VerifiedImage:
    """Fetch ``repository@digest`` into ``dest`` and verify every blob."""
    manifest_digest = resolve_digest(puller, repository, digest, name)
    pulled = puller.fetch(repository, manifest_digest, dest)
    what = f"image {name}: manifest {manifest_digest}"
    mf.verify_bytes(pulled.manifest, manifest_digest, what)
    manifest = mf.parse_manifest(pulled.manifest, what)
    config_path = _check_blob(pulled.blob_dir, manifest.config, name)
    config = mf.parse_config(config_path.read_bytes(), f"image {name}: config {manifest.config.digest}")
    if (config.os, config.architecture) != ("linux", "amd64"):
        raise DatasetError(f"image {name}: built for {config.os}/{config.architecture}, not linux/amd64")
    if len(config.diff_ids) != len(manifest.layers):
        raise DatasetError(f"image {name}: config lists {len(config.diff_ids)} diff_ids for "
                           f"{len(manifest.layers)} layers")
    layers = tuple((desc.digest, mf.LAYER_TYPES[desc.media_type] or "",
                    _check_blob(pulled.blob_dir, desc, name)) for desc in manifest.layers)
    return VerifiedImage(name=name, digest=digest, config_digest=manifest.config.digest,
                         diff_ids=config.diff_ids, layers=layers, env=config.env,
                         working_dir=config.working_dir)
