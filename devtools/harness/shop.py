"""A prepared Shop installation for tests and benchmarks, built once and
cached under ``$CAMG_CACHE/shop`` keyed by the product-pool hash.

It runs the real preparation steps (scripts/prepare_java.py's layout and
``python -m camg.prepare_shop``) on the shipped 1k catalog; a cached copy is
reused only while its manifest's recorded hashes still match the files.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from camg.config import task_manifest as manifest
from camg.config.hashing import sha256_bytes
from camg.errors import ConfigError
from devtools.harness.auth import deployment_auth
from environments.shop import catalog, goals, javahome, store

DEBIAN_JDK = "/usr/lib/jvm/java-17-openjdk-amd64"
REPO = Path(__file__).resolve().parents[2]
#: heap of the JVM a test or bench process runs (one JVM per process)
TEST_HEAP_MB = 768


def cache_root() -> Path:
    root = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test")) / "shop"
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.lru_cache(maxsize=None)
def java_home() -> str:
    """A Conda-style JAVA_HOME over Debian's openjdk-17 (packaging/apt/shop.txt)."""
    home = cache_root() / "java"
    with locked(cache_root() / ".java.lock"):
        javahome.build_layout(DEBIAN_JDK, home)
    return str(home)


@functools.lru_cache(maxsize=None)
def pool() -> list[dict]:
    """The shipped 1k catalog as camg.prepare_shop builds its product pool
    (callers must not modify it: it is shared)."""
    from environments.shop import prepare as prepare_shop
    return prepare_shop.build_pool(prepare_shop.DEFAULT_CATALOG, prepare_shop.DEFAULT_INSTRUCTIONS,
                                   prepare_shop.DEFAULT_HUMAN)


@functools.lru_cache(maxsize=None)
def prepared() -> tuple[Path, dict]:
    """(prepared directory, settings) of the default 1k preparation."""
    from environments.shop import prepare as prepare_shop
    # keyed by the pool hash, the code that turns a pool into goals and
    # documents, and the pyserini that indexes them, so a changed generator
    # or indexer never reuses stale tasks or a stale index
    code = b"".join(Path(m.__file__).read_bytes()
                     for m in (prepare_shop, goals, catalog, store))
    code += metadata.version("pyserini").encode()
    pool_hash = sha256_bytes(prepare_shop.pool_bytes(pool())).removeprefix("sha256:")[:16]
    key = f"{pool_hash}-{sha256_bytes(code).removeprefix('sha256:')[:8]}"
    out = cache_root() / f"pool-{key}"
    home = java_home()
    with locked(cache_root() / f".{key}.lock"):
        if not _still_valid(out):
            proc = subprocess.run(
                [sys.executable, "-m", "camg.prepare_shop", "--output", str(out),
                 "--java-home", home, "--jvm-heap-mb", str(TEST_HEAP_MB)],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"camg.prepare_shop failed:\n{proc.stderr[-3000:]}")
    settings = json.loads((out / "settings.json").read_text())
    return out, settings


def _still_valid(out: Path) -> bool:
    if not (out / "manifest.json").exists() or not (out / "settings.json").exists():
        return False
    try:
        manifest.load(out / "manifest.json").verify_files()
    except (ConfigError, OSError):
        return False
    return True


class locked:
    """An exclusive flock on ``path`` for the block (cache builders)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def configure_service(tmp: Path, *, jvm_heap_mb: int = 512, capacity: int = 4,
                      references: bool = False, preparation: Path | None = None) -> Path:
    """Run camg.configure for a Shop service on a free loopback port over the
    cached preparation (or the prepared directory ``preparation``); returns
    the prepared service config path."""
    from camg.configure import configure
    from devtools.harness.services import clean_git_tree, free_port
    if preparation is None:
        prepared_dir, settings = prepared()
    else:
        prepared_dir = preparation
        settings = json.loads((preparation / "settings.json").read_text())
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "requirements.lock").write_text("pyserini==0.24.0\n")
    deployment = {
        "runtime_lock": str(tmp / "requirements.lock"),
        "auth": deployment_auth(),
        "state_root": str(tmp / "state"),
        "helper_socket": str(tmp / "helper.sock"),
        "executables": {},
        "environments": {"shop": {
            "manifest": str(prepared_dir / "manifest.json"), "port": free_port(),
            "capacity": capacity, "references": references,
            "settings": dict(settings, jvm_heap_mb=jvm_heap_mb, verify_index_full=False)}},
    }
    (tmp / "deployment.json").write_text(json.dumps(deployment))
    configure(tmp / "deployment.json", tmp / "prepared", source_tree=clean_git_tree(tmp / "src"))
    return tmp / "prepared" / "shop.json"
