"""The AutoResearch demo image: Debian bookworm + a research virtualenv from PyPI,
built without Docker.

Layers (each cached under ``<cache_root>/autoresearch``, keyed by its inputs):

1. the Coding demo's ``debootstrap --variant=minbase`` bookworm base
   (tools.oci_demo, shared cache: one debootstrap for both images);
2. /opt/research-venv made by the rootfs's own python3 in a chroot with no
   network, holding numpy, scipy and scikit-learn at the versions of
   requirements.lock, minus scikit-learn's bundled data sets (STRIPPED),
   plus /workspace owned by the agent (uid 2000) — the directory an agent
   writes its experiments and its submission in.

Like the Coding demo it is published to the loopback registry, pulled back
by digest and materialized by tools.oci (``ensure_image``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

from camg.config.hashing import sha256_json
from camg.errors import DatasetError
from camg.oci.images import ImageSpec, MaterializedImage
from tools import oci_demo as base_demo
from tools.loopback_registry import LocalRegistry
from tools.oci import cache, layout
from tools.oci.prepare import default_options, prepare_images
from tools.oci.pull import SkopeoPuller

NAME = "camg/demo-autoresearch"
REPOSITORY = "camg/demo-autoresearch"
TAG = "sklearn-1.9.1-monai-1.6.1"
VENV = "/opt/research-venv"
WORKSPACE = "/workspace"
AGENT_UID = 2000
# The versions requirements.lock pins for the service (the grader's numpy
# and the builder's scikit-learn are the same releases).
REQUIREMENTS = (
    "numpy==2.4.6",
    "scipy==1.17.1",
    "scikit-learn==1.9.1",
    "joblib==1.6.0",
    "threadpoolctl==3.8.0",
    "cloudpickle==3.1.3",
    "narwhals==2.29.0",
    # MONAI on CPU torch (torch's own dependencies, at the lock's versions)
    "monai==1.6.1",
    "torch==2.13.0+cpu",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "Jinja2==3.1.6",
    "MarkupSafe==3.0.4",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "sympy==1.14.0",
    "typing_extensions==4.16.0",
)
# torch's CPU build (2.13.0+cpu, ~190 MB) is not on PyPI: PyPI's torch 2.13.0
# is the CUDA build, which needs ~3 GB of nvidia-* runtime wheels a CPU-only
# sandbox never loads. So the image takes the CPU build from the PyTorch
# project's own CPU index, the one source besides PyPI (docs/operators.md,
# "Python packages"); every other pin here is on PyPI (tests/unit/test_pypi_only.py).
# CAMG_TORCH_WHEELS names another directory or page that holds it instead;
# pip's own configured find-links are searched as well.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu/torch/"
LOCAL_WHEELS = (
    os.environ.get("CAMG_TORCH_WHEELS") or os.environ.get("CAMG_LOCAL_WHEELS") or TORCH_CPU_INDEX
)
VENV_LAYER_VERSION = 2
# scikit-learn's wheel bundles real data sets (breast cancer, digits,
# diabetes, iris, wine, linnerud) and their descriptions: a task drawn from
# any of them could be answered by lookup, so the image carries none.
# (camg.prepare --environment autoresearch --validate scans for any other copy.)
STRIPPED = ("sklearn/datasets/data", "sklearn/datasets/descr")
ENV = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    f"VIRTUAL_ENV={VENV}",
    "OMP_NUM_THREADS=1",
    "OPENBLAS_NUM_THREADS=1",
    "HOME=/workspace",
)


@dataclasses.dataclass(frozen=True)
class Image:
    rootfs: Path
    image: MaterializedImage
    spec: ImageSpec


def _key(value: object) -> str:
    return sha256_json(value).split(":", 1)[1][:16]


def _wheels(root: Path) -> Path:
    key = _key(
        {
            "requirements": REQUIREMENTS,
            "python": base_demo.PYTHON_TAG,
            "platforms": base_demo.PLATFORMS,
        }
    )
    final = root / f"wheels-{key}"
    if (final / "requirements.txt").is_file():
        return final
    with base_demo._building(final) as work:
        version, impl, abi = base_demo.PYTHON_TAG
        platforms = [a for p in base_demo.PLATFORMS for a in ("--platform", p)]
        base_demo._run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                version,
                "--implementation",
                impl,
                "--abi",
                abi,
                *platforms,
                "--find-links",
                LOCAL_WHEELS,
                "-d",
                str(work),
                *REQUIREMENTS,
            ],
            "pip download",
        )
        (work / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n")
    return final


def _venv(
    root: Path, rootfs: Path, demo_lock: Path, base: layout.Layer, wheels: Path
) -> layout.Layer:
    key = _key(
        {
            "base": base.digest,
            "requirements": REQUIREMENTS,
            "venv": VENV,
            "workspace": WORKSPACE,
            "stripped": STRIPPED,
            "v": VENV_LAYER_VERSION,
        }
    )
    final = root / f"venv-{key}"
    cached = base_demo._cached_layer(final)
    if cached is not None:
        return cached
    # The base rootfs is shared with the Coding demo, which builds its own
    # layers inside it (tools/oci_demo.py: wheels in /tmp/camg-wheels, its
    # venvs) under the demo's lock: copy it under that lock too, then work
    # on the copy. (Copied without it, a fresh machine's first build saw the
    # Coding build's /tmp/camg-wheels in the copy: FileExistsError below.)
    with tempfile.TemporaryDirectory(prefix="rootfs.", dir=root / "tmp") as scratch:
        tree = Path(scratch) / "rootfs"
        with base_demo.locked(demo_lock):
            base_demo._run(["cp", "-a", str(rootfs), str(tree)], "copying the base rootfs")
        inside = tree / "tmp" / "camg-wheels"
        shutil.rmtree(inside, ignore_errors=True)  # a build interrupted before the lock
        shutil.copytree(wheels, inside)
        with base_demo._building(final) as work:
            chroot = [
                "unshare",
                "--mount",
                "--net",
                "--propagation",
                "private",
                "chroot",
                str(tree),
            ]
            base_demo._run(
                [*chroot, "/usr/bin/python3", "-m", "venv", VENV],
                "python3 -m venv",
                env=base_demo.CHROOT_ENV,
            )
            base_demo._run(
                [
                    *chroot,
                    f"{VENV}/bin/python",
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-index",
                    "--no-deps",
                    "--no-cache-dir",
                    "--disable-pip-version-check",
                    "--find-links",
                    "/tmp/camg-wheels",
                    "-r",
                    "/tmp/camg-wheels/requirements.txt",
                ],
                "pip install",
                env=base_demo.CHROOT_ENV,
            )
            _strip_datasets(tree)
            ws = tree / WORKSPACE.lstrip("/")
            ws.mkdir(mode=0o755, exist_ok=True)
            os.chown(ws, AGENT_UID, AGENT_UID)
            layer = layout.layer_from_tree(
                tree, work / "layer.tar.gz", include=(VENV.lstrip("/"), WORKSPACE.lstrip("/"))
            )
            base_demo._finish_layer(work, layer)
    built = base_demo._cached_layer(final)
    assert built is not None  # written by _finish_layer, moved to final by _building just above
    return built


def _strip_datasets(tree: Path) -> None:
    """Every file of STRIPPED's directories but their package __init__.py."""
    found = 0
    for site in (tree / VENV.lstrip("/")).glob("lib/python3*/site-packages"):
        for relative in STRIPPED:
            directory = site / relative
            for path in directory.rglob("*") if directory.is_dir() else ():
                if (
                    path.is_file()
                    and path.name != "__init__.py"
                    and "__pycache__" not in path.parts
                ):
                    path.unlink()
                    found += 1
    if not found:
        raise DatasetError(f"autoresearch image: none of {STRIPPED} found to strip")


def build(cache_root: Path) -> base_demo.DemoBuild:
    """The image as an OCI layout under ``cache_root``/autoresearch (cached)."""
    cache_root = Path(cache_root).absolute()
    demo = cache_root / "demo"
    root = cache_root / "autoresearch"
    with base_demo.locked(demo / "lock"):
        (demo / "tmp").mkdir(parents=True, exist_ok=True)
        rootfs, base = base_demo._base(demo)
    with base_demo.locked(root / "lock"):
        shutil.rmtree(root / "tmp", ignore_errors=True)
        (root / "tmp").mkdir(parents=True)
        venv = _venv(root, rootfs, demo / "lock", base, _wheels(root))
        layers = (base, venv)
        config = layout.image_config(
            layers,
            env=ENV,
            working_dir=WORKSPACE,
            labels={
                "org.opencontainers.image.title": NAME,
                "camg.demo.requirements": ",".join(REQUIREMENTS),
            },
            history=(
                "debootstrap --variant=minbase bookworm (camg coding demo base)",
                f"python3 -m venv {VENV} && pip install {' '.join(REQUIREMENTS)} && "
                f"rm (all but __init__.py of) {' '.join(STRIPPED)}",
            ),
        )
        out = root / f"layout-{_key([base.digest, venv.digest, sha256_json(config.decode())])}"
        digest_file = out / "digest"
        if not digest_file.is_file():
            shutil.rmtree(out, ignore_errors=True)
            digest = layout.write_layout(out, layers, config, TAG)
            digest_file.write_text(digest + "\n")
        return base_demo.DemoBuild(out, TAG, digest_file.read_text().strip(), layers)


def spec_for(registry: str, digest: str) -> ImageSpec:
    return ImageSpec(
        name=NAME, repository=f"{registry}/{REPOSITORY}", digest=digest, workspace=WORKSPACE
    )


def ensure_image(cache_root: str | Path, *, skopeo: str = "skopeo") -> Image:
    """Build (cached), push to a throwaway loopback registry, pull back by
    digest and materialize; a verified materialization is reused."""
    cache_root = Path(cache_root).absolute()
    built = build(cache_root)
    marker = cache.read_marker(cache_root, built.digest)
    if marker is not None and cache.marker_matches(
        marker, cache_root, built.digest, default_options()
    ):
        spec = spec_for(marker["repository"].rsplit("/", 2)[0], built.digest)
        return _materialize(spec, cache_root, skopeo)
    with (
        tempfile.TemporaryDirectory(prefix="camg-registry.") as state,
        LocalRegistry(Path(state)) as local,
    ):
        spec = spec_for(local.address, built.digest)
        served = layout.push(built.layout, built.tag, spec.repository, skopeo=skopeo)
        if served != built.digest:
            raise DatasetError(
                f"autoresearch image: registry serves {served}, built {built.digest}"
            )
        return _materialize(spec, cache_root, skopeo)


def _materialize(spec: ImageSpec, cache_root: Path, skopeo: str) -> Image:
    (image,) = prepare_images([spec], cache_root, SkopeoPuller(skopeo))
    return Image(Path(image.rootfs), image, spec)


if __name__ == "__main__":
    built_image = ensure_image(base_demo.cache_root_from_env())
    print(built_image.rootfs, built_image.image.digest)
