"""Shared fixtures for the OCI tests: a real docker-registry on loopback and image publishing.

Test modules import from here (conftest.py belongs to the helper's tests).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tools.oci import layout
from tools.loopback_registry import LocalRegistry

REPO_ROOT = Path(__file__).resolve().parents[2]
PREPARE = REPO_ROOT / "scripts" / "prepare_images.py"


def cache_dir() -> Path:
    return Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie we have not reaped still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("privileged: run as root")
    reg = LocalRegistry(tmp_path_factory.mktemp("registry")).start()
    pid = reg.pid
    yield reg
    reg.stop()
    reg.stop()  # idempotent
    assert not pid_alive(pid), "docker-registry survived its fixture"


def tar_entry(name, kind="file", data=b"", mode=None, linkname="", uid=0, gid=0):
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE}[kind]
    info.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    info.linkname, info.uid, info.gid, info.mtime = linkname, uid, gid, 1_700_000_000
    if kind == "file":
        info.size = len(data)
    return info, data


def tar_bytes(*entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def publish(registry: LocalRegistry, work: Path, repository: str, layers: list[bytes], *,
            diff_ids: list[str] | None = None, tag: str = "test", index: bool = False,
            docker_format: bool = False) -> tuple[str, list[layout.Layer]]:
    """Push an image made of these uncompressed layer tars; returns (served digest, layers)."""
    work.mkdir(parents=True, exist_ok=True)
    blobs = [layout.gzip_tar_bytes(data, work / f"layer{i}.tar.gz") for i, data in enumerate(layers)]
    if diff_ids is not None:  # a config that lies about its layers
        blobs_for_config = [layout.Layer(b.path, b.digest, d, b.size) for b, d in zip(blobs, diff_ids)]
    else:
        blobs_for_config = blobs
    config = layout.image_config(blobs_for_config, env=["PATH=/usr/bin:/bin"], working_dir="/testbed")
    written = layout.write_layout(work / "layout", blobs, config, tag, index=index)
    served = layout.push(work / "layout", tag, f"{registry.address}/{repository}",
                         docker_format=docker_format)
    assert docker_format or served == written, "the registry changed our manifest"
    return served, blobs


def write_images(path: Path, images: list[dict]) -> Path:
    path.write_text(json.dumps({"version": 1, "images": images}, indent=2))
    return path


def run_prepare(cache_root: Path, images: Path, output: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PREPARE), "--cache-root", str(cache_root),
                           "--crane", "/nonexistent/crane", "--images", str(images),
                           "--output", str(output), *extra],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)


def leftovers(cache_root: Path) -> list[str]:
    """Anything under the cache's work area or a published image dir without its marker."""
    found = [str(p) for p in (cache_root / "tmp").glob("*")] if (cache_root / "tmp").exists() else []
    for image in (cache_root / "images").glob("*") if (cache_root / "images").exists() else []:
        if not (image / "complete.json").is_file():
            found.append(str(image))
    return found
