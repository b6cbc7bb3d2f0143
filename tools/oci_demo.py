"""The demo images: Debian bookworm plus apispec 6.8.1's test environment, built without Docker.

Both are specs of the one image builder (tools/oci/build.py), which every
repository's image goes through (``python -m tools.prepare_image``):

1. ``camg/demo-apispec-6.8.1`` (flavour "plain", the builder's venv layout):
   /opt/testbed-venv, made by the rootfs's own python3 (in a chroot with no
   network), holding apispec 6.8.1's test dependencies (its ``tests`` extra:
   pytest, marshmallow, PyYAML, openapi-spec-validator 0.7.1, pinned with
   everything they pull in), plus an empty /testbed. apispec itself is not
   in the image: the Coding service lays a task's repository at /testbed.
   The venv's site-packages holds ``testbed.pth`` naming /testbed/src, so
   ``/opt/testbed-venv/bin/python -m pytest`` run in /testbed imports
   apispec from the task's source without installing it.
2. ``camg/demo-apispec-6.8.1-swesmith`` (flavour "swesmith", the builder's
   SWE-smith layout): the repository cloned at /testbed with its own
   history (the demo mirror's base commit), installed editable into an
   environment that the profiles' test command activates (``source
   /opt/miniconda3/bin/activate; conda activate testbed``), and untracked
   build artifacts (bytecode) left in the clone.

Every step is cached under ``<cache_root>/demo``, keyed by its inputs (the
keys and digests these images had before the builder was shared are kept);
a cached rebuild only re-checks the cache (and pushes, when asked to).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from camg.errors import DatasetError
from camg.oci.images import FORMAT_VERSION, ImageSpec, MaterializedImage
from tools.loopback_registry import LocalRegistry
from tools.oci import cache, layout
from tools.oci import build as builder
from tools.oci.build import (  # noqa: F401  (the names other builders and tests use)
    BASE_LAYER_VERSION,
    BASE_PACKAGES,
    CHROOT_ENV,
    CONDA_ACTIVATE,
    CONDA_ROOT,
    MIRROR,
    PLATFORMS,
    PYTHON_TAG,
    SUITE,
    VENV,
    WORKSPACE,
    _base,
    _building,
    _cached_layer,
    _finish_layer,
    _run,
    locked,
)
from tools.oci.prepare import default_options, prepare_images
from tools.oci.pull import SkopeoPuller

NAME = "camg/demo-apispec-6.8.1"
REPOSITORY = "camg/demo-apispec"
TAG = "6.8.1"
# apispec 6.8.1's [tests] extra = apispec[yaml,marshmallow], openapi-spec-validator==0.7.1,
# pytest; resolved once and pinned whole, so the venv never drifts.
REQUIREMENTS = (
    "attrs==26.1.0", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3", "idna==3.20",
    "iniconfig==2.3.1", "jsonschema==4.26.0", "jsonschema-path==0.3.4",
    "jsonschema-specifications==2025.9.1", "lazy-object-proxy==1.13.0", "marshmallow==3.26.1",
    "openapi-schema-validator==0.6.3", "openapi-spec-validator==0.7.1", "packaging==24.2",
    "pathable==0.4.4", "pluggy==1.7.0", "pytest==8.3.4", "PyYAML==6.0.2", "referencing==0.36.2",
    "requests==2.34.2", "rfc3339-validator==0.1.4", "rpds-py==2026.9.1", "six==1.17.0",
    "typing-extensions==4.16.0", "urllib3==2.8.0",
)
ENV = (f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG=C.UTF-8", f"VIRTUAL_ENV={VENV}")

SWESMITH_NAME = "camg/demo-apispec-6.8.1-swesmith"
SWESMITH_REPOSITORY = "camg/demo-apispec-swesmith"
CONDA_ENV = f"{CONDA_ROOT}/envs/testbed"
BUILD_REQUIREMENTS = ("flit-core==3.12.0",)      # apispec's build backend (flit_core<4)
SWESMITH_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8")
# SWE-smith's PythonProfile.test_cmd (environments.coding.profiles.SWESMITH_PYTHON_TEST_CMD)
SWESMITH_TEST_CMD = ("source /opt/miniconda3/bin/activate; conda activate testbed; "
                     "pytest --disable-warnings --color=no --tb=no --verbose")
_DEBOOTSTRAP = f"debootstrap --variant=minbase --include={','.join(BASE_PACKAGES)} {SUITE}"

PLAIN_SPEC = builder.ImageBuildSpec(
    name=NAME, repository=REPOSITORY, tag=TAG, layout="venv", pip_packages=REQUIREMENTS,
    venv=VENV, pth=(f"{WORKSPACE}/src",),
    labels={"org.opencontainers.image.title": NAME,
            "camg.demo.requirements": ",".join(REQUIREMENTS)},
    history=(_DEBOOTSTRAP, f"python3 -m venv {VENV} && pip install apispec[tests] pins"))
SWESMITH_SPEC = builder.ImageBuildSpec(
    name=SWESMITH_NAME, repository=SWESMITH_REPOSITORY, tag=TAG, layout="swesmith",
    source=builder.Source(sdist="apispec==6.8.1"), pip_packages=REQUIREMENTS,
    build_packages=BUILD_REQUIREMENTS,
    # SWE-smith's install_cmds (`python -m pip install -e .`), without
    # resolving anything: every package is pinned and installed already.
    install_cmds=("python -m pip install --no-build-isolation --no-deps -e .",),
    compile=("src",), test_cmd=SWESMITH_TEST_CMD,
    labels={"org.opencontainers.image.title": SWESMITH_NAME,
            "camg.demo.requirements": ",".join(REQUIREMENTS + BUILD_REQUIREMENTS)},
    history=(_DEBOOTSTRAP,
             f"git clone (base commit) /testbed; venv {CONDA_ENV}; pip install -e /testbed; "
             "conda activation stand-in"))
SPECS = {"plain": PLAIN_SPEC, "swesmith": SWESMITH_SPEC}
assert PLAIN_SPEC.env == ENV and SWESMITH_SPEC.env == SWESMITH_ENV

DemoBuild = builder.Build


@dataclasses.dataclass(frozen=True)
class DemoImage:
    rootfs: Path
    image: MaterializedImage
    spec: ImageSpec


def build_demo(cache_root: Path, flavor: str = "plain") -> DemoBuild:
    """The demo image as an OCI layout under ``cache_root``/demo (cached).

    ``flavor``: "plain" (the test venv at /opt/testbed-venv, an empty
    /testbed) or "swesmith" (laid out like a SWE-smith image, see above).
    """
    if flavor not in FLAVORS:
        raise DatasetError(f"demo image: unknown flavour {flavor!r}")
    return builder.build_image(SPECS[flavor], cache_root)


FLAVORS = {"plain": (NAME, REPOSITORY), "swesmith": (SWESMITH_NAME, SWESMITH_REPOSITORY)}


def spec_for(registry: str, digest: str, flavor: str = "plain") -> ImageSpec:
    name, repository = FLAVORS[flavor]
    return ImageSpec(name=name, repository=f"{registry}/{repository}", digest=digest,
                     workspace=WORKSPACE)


def publish(build: DemoBuild, registry: str, *, skopeo: str = "skopeo") -> ImageSpec:
    spec = spec_for(registry, build.digest, build.flavor)
    served = layout.push(build.layout, build.tag, spec.repository, skopeo=skopeo)
    if served != build.digest:
        raise DatasetError(f"demo image: registry {registry} serves {served}, built {build.digest}")
    return spec


def write_images_file(path: Path, spec: ImageSpec) -> Path:
    """The images.json prepare_images.py consumes (``--images PATH``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": FORMAT_VERSION, "images": [dataclasses.asdict(spec)]},
                               indent=2) + "\n")
    return path


def cache_root_from_env() -> Path:
    """Where tests and benchmarks keep the demo build: $CAMG_CACHE/oci."""
    return Path(os.environ.get("CAMG_CACHE") or "/var/cache/camg-test") / "oci"


def ensure_demo_image(cache_root: str | Path, registry: str | None = None, *,
                      skopeo: str = "skopeo", flavor: str = "plain") -> DemoImage:
    """Build (cached), publish and pull back the demo image; returns its materialized rootfs.

    With ``registry=None`` a throwaway docker-registry is started on
    loopback for the push and the pull, and stopped again. When the
    materialized image for the built digest is already verified in the
    cache, nothing is pushed or pulled.
    """
    cache_root = Path(cache_root).absolute()
    build = build_demo(cache_root, flavor)
    options = default_options()
    marker = cache.read_marker(cache_root, build.digest)
    if cache.marker_matches(marker, cache_root, build.digest, options) and registry is None:
        registry_part = marker["repository"][:-len(FLAVORS[flavor][1]) - 1]
        spec = spec_for(registry_part, build.digest, flavor)
        return _materialize(spec, cache_root, skopeo)
    if registry is not None:
        return _materialize(publish(build, registry, skopeo=skopeo), cache_root, skopeo)
    with tempfile.TemporaryDirectory(prefix="camg-registry.") as state, LocalRegistry(Path(state)) as local:
        return _materialize(publish(build, local.address, skopeo=skopeo), cache_root, skopeo)


def _materialize(spec: ImageSpec, cache_root: Path, skopeo: str) -> DemoImage:
    (image,) = prepare_images([spec], cache_root, SkopeoPuller(skopeo))
    return DemoImage(Path(image.rootfs), image, spec)
