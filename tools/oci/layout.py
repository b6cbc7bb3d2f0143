"""Writing OCI images without Docker: layers, config, manifest, an oci: layout, and a push.

Used by the demo image build and by the tests that serve hand-made (good and
malicious) images. Layers are gzip'd tars whose digests and diff_ids are
computed while writing; the config pins ``created`` so an image built from
the same layers always has the same manifest digest.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from camg.errors import DatasetError
from tools.oci import manifest as mf
from tools.oci.digest import HashingWriter, file_digest, hex_of, sha256_bytes
from tools.oci.pull import is_loopback

EPOCH = "1970-01-01T00:00:00Z"


@dataclasses.dataclass(frozen=True)
class Layer:
    path: Path  # the gzip'd tar
    digest: str
    diff_id: str
    size: int

    def to_json(self) -> dict:
        return {"digest": self.digest, "diff_id": self.diff_id, "size": self.size}


def gzip_tar_bytes(tar_bytes: bytes, dest: Path) -> Layer:
    """Wrap an uncompressed tar (e.g. a hand-made malicious layer) as a gzip layer blob."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(tar_bytes)
    dest.write_bytes(buf.getvalue())
    digest, size = file_digest(dest)
    return Layer(dest, digest, sha256_bytes(tar_bytes), size)


def layer_from_tree(root: Path, dest: Path, *, include: Sequence[str] | None = None,
                    exclude: Iterable[str] = (), compresslevel: int = 1) -> Layer:
    """A layer of the tree under ``root`` (or of the subtrees named in ``include``).

    Entries are sorted, owners numeric, device nodes and sockets left out
    (a sandbox brings its own /dev). Symlinks are stored, never followed.
    """
    excluded = {e.strip("/") for e in exclude}
    tmp = dest.with_name(dest.name + ".partial")
    with open(tmp, "wb") as raw:
        outer = HashingWriter(raw)
        with gzip.GzipFile(fileobj=outer, mode="wb", mtime=0, compresslevel=compresslevel) as gz:
            inner = HashingWriter(gz)
            with tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for rel in _walk(root, include, excluded):
                    _add(tar, root, rel)
    os.replace(tmp, dest)
    return Layer(dest, outer.digest, inner.digest, outer.size)


def _walk(root: Path, include: Sequence[str] | None, excluded: set[str]) -> Iterable[str]:
    tops = sorted(i.strip("/") for i in include) if include is not None else None
    if tops is None:
        stack = sorted(os.listdir(root), reverse=True)
    else:
        stack = list(reversed(tops))
    while stack:
        rel = stack.pop()
        if rel in excluded:
            continue
        yield rel
        path = root / rel
        if stat.S_ISDIR(os.lstat(path).st_mode):
            stack.extend(f"{rel}/{name}" for name in sorted(os.listdir(path), reverse=True))


def _add(tar: tarfile.TarFile, root: Path, rel: str) -> None:
    info = tar.gettarinfo(str(root / rel), arcname=rel)
    if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
        return
    info.uname = info.gname = ""
    if info.isreg():
        with open(root / rel, "rb") as handle:
            tar.addfile(info, handle)
    else:
        tar.addfile(info)


def image_config(layers: Sequence[Layer], *, env: Sequence[str] = (), working_dir: str = "",
                 labels: dict | None = None, history: Sequence[str] = ()) -> bytes:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": EPOCH,
        "config": {"Env": list(env), "WorkingDir": working_dir, "Labels": dict(labels or {})},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": EPOCH, "created_by": h} for h in history],
    }
    return json.dumps(config, indent=2, sort_keys=True).encode()


def write_layout(layout: Path, layers: Sequence[Layer], config: bytes, tag: str, *,
                 index: bool = False) -> str:
    """Write an OCI image layout holding one image; returns its manifest digest.

    With ``index`` the tag names an image index listing the image for
    linux/amd64 (as multi-platform images are published), and the index
    digest is returned.
    """
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}\n')
    for layer in layers:
        target = blobs / hex_of(layer.digest)
        if not target.exists():
            try:
                os.link(layer.path, target)
            except OSError:  # another file system: copy instead
                shutil.copyfile(layer.path, target)
    config_digest = _blob(blobs, config)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": mf.OCI_MANIFEST,
        "config": {"mediaType": mf.OCI_CONFIG, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer.digest, "size": layer.size} for layer in layers],
    }, indent=2).encode()
    top = {"mediaType": mf.OCI_MANIFEST, "digest": _blob(blobs, manifest), "size": len(manifest)}
    if index:
        image_index = json.dumps({"schemaVersion": 2, "mediaType": mf.OCI_INDEX, "manifests": [
            dict(top, platform={"architecture": "amd64", "os": "linux"})]}, indent=2).encode()
        top = {"mediaType": mf.OCI_INDEX, "digest": _blob(blobs, image_index), "size": len(image_index)}
    layout_index = {"schemaVersion": 2, "mediaType": mf.OCI_INDEX, "manifests": [
        dict(top, annotations={"org.opencontainers.image.ref.name": tag})]}
    (layout / "index.json").write_text(json.dumps(layout_index, indent=2) + "\n")
    return top["digest"]


def _blob(blobs: Path, data: bytes) -> str:
    digest = sha256_bytes(data)
    (blobs / hex_of(digest)).write_bytes(data)
    return digest


def push(layout: Path, tag: str, repository: str, *, skopeo: str = "skopeo", insecure: bool = False,
         docker_format: bool = False) -> str:
    """Push the layout's image (or index, with every image in it) to ``repository:tag``.

    By default the manifest bytes are kept (``--preserve-digests``), so the
    digest is the one ``write_layout`` returned; ``docker_format`` converts
    to Docker's v2 schema 2 the way ``docker push`` stores images. Returns
    the digest of the manifest the registry now serves.
    """
    plain = insecure or is_loopback(repository)
    tls = "false" if plain else "true"
    convert = ["--format", "v2s2"] if docker_format else ["--preserve-digests"]
    ref = f"docker://{repository}:{tag}"
    _skopeo([skopeo, "copy", "--quiet", "--all", *convert, f"--dest-tls-verify={tls}",
             f"oci:{layout}:{tag}", ref], f"push of {repository}:{tag}")
    return sha256_bytes(_skopeo([skopeo, "inspect", "--raw", f"--tls-verify={tls}", ref],
                                f"manifest of {repository}:{tag}"))


def _skopeo(argv: list[str], what: str) -> bytes:
    proc = subprocess.run(argv, capture_output=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise DatasetError(f"{what} failed: {proc.stderr.decode(errors='replace').strip()[-2000:]}")
    return proc.stdout
