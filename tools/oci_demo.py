"""The demo image: Debian bookworm plus a test virtualenv for apispec 6.8.1, built without Docker.

Two layers:

1. a ``debootstrap --variant=minbase`` bookworm rootfs with python3,
   python3-venv, git, patch and ca-certificates;
2. /opt/testbed-venv, made by the rootfs's own python3 (in a chroot with no
   network), holding apispec 6.8.1's test dependencies (its ``tests`` extra:
   pytest, marshmallow, PyYAML, openapi-spec-validator 0.7.1, pinned with
   everything they pull in), plus an empty /testbed.

apispec itself is not in the image: the Coding service lays a task's
repository at /testbed. The venv's site-packages holds ``testbed.pth``
naming /testbed/src, so ``/opt/testbed-venv/bin/python -m pytest`` run in
/testbed imports apispec from the task's source without installing it.

Every step is cached under ``<cache_root>/demo``, keyed by its inputs;
a cached rebuild only re-checks the cache (and pushes, when asked to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from camg.errors import DatasetError
from camg.config.hashing import sha256_json
from camg.oci.images import ImageSpec, MaterializedImage, FORMAT_VERSION
from tools.oci import cache, layout
from tools.oci.prepare import default_options, prepare_images
from tools.oci.pull import SkopeoPuller
from tools.loopback_registry import LocalRegistry

NAME = "camg/demo-apispec-6.8.1"
REPOSITORY = "camg/demo-apispec"
TAG = "6.8.1"
WORKSPACE = "/testbed"
VENV = "/opt/testbed-venv"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "git", "patch", "ca-certificates")
# bookworm's python3 and glibc (2.36); pip does not widen a given --platform
# to older manylinux tags itself, so they are listed.
PYTHON_TAG = ("3.11", "cp", "cp311")
PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
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
BASE_LAYER_VERSION = 2
ENV = (f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG=C.UTF-8", f"VIRTUAL_ENV={VENV}")
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME": "/root", "LANG": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class DemoBuild:
    layout: Path
    tag: str
    digest: str
    layers: tuple[layout.Layer, ...]
    flavor: str = "plain"


@dataclasses.dataclass(frozen=True)
class DemoImage:
    rootfs: Path
    image: MaterializedImage
    spec: ImageSpec


def _key(value: object) -> str:
    return sha256_json(value).split(":", 1)[1][:16]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing): one builder at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _building(final: Path) -> Iterator[Path]:
    """A work dir that becomes ``final`` only if the block succeeds."""
    work = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=final.parent / "tmp"))
    try:
        yield work
        if final.exists():
            shutil.rmtree(final)
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _run(argv: list[str], what: str, timeout: float = 1800, env: dict | None = None) -> None:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          env=env, check=False)
    if proc.returncode != 0:
        raise DatasetError(f"demo image: {what} failed (exit {proc.returncode}): "
                           f"{proc.stdout.decode(errors='replace')[-3000:]}")


def _cached_layer(directory: Path) -> layout.Layer | None:
    try:
        meta = json.loads((directory / "layer.json").read_text())
    except (OSError, ValueError):
        return None
    path = directory / "layer.tar.gz"
    if not path.is_file() or path.stat().st_size != meta.get("size"):
        return None
    return layout.Layer(path, meta["digest"], meta["diff_id"], meta["size"])


def _finish_layer(directory: Path, layer: layout.Layer) -> layout.Layer:
    (directory / "layer.json").write_text(json.dumps(layer.to_json()) + "\n")
    return layer


def _base(demo: Path) -> tuple[Path, layout.Layer]:
    key = _key({"suite": SUITE, "mirror": MIRROR, "variant": "minbase", "include": BASE_PACKAGES})
    final = demo / f"base-{key}"
    rootfs = final / "rootfs"
    if not (final / "debootstrap.done").is_file():
        _debootstrap(final)
    # The layer is cached apart from the rootfs: a new layer format must
    # not cost another debootstrap.
    layer_dir = final / f"layer-v{BASE_LAYER_VERSION}"
    cached = _cached_layer(layer_dir)
    if cached is not None:
        return rootfs, cached
    shutil.rmtree(layer_dir, ignore_errors=True)
    layer_dir.mkdir()
    # /dev is shipped empty: a sandbox mounts its own minimal /dev there.
    devices = tuple(f"dev/{name}" for name in os.listdir(rootfs / "dev"))
    # The venv build adds these to the same tree; they belong to the next layer.
    later = (VENV.lstrip("/"), WORKSPACE.lstrip("/"))
    layer = layout.layer_from_tree(rootfs, layer_dir / "layer.tar.gz", exclude=devices + later)
    return rootfs, _finish_layer(layer_dir, layer)


def _debootstrap(final: Path) -> None:
    with _building(final) as work:
        rootfs = work / "rootfs"
        # A private mount namespace: whatever debootstrap mounts in the
        # target (proc, sys) disappears with it, even when it fails.
        _run(["unshare", "--mount", "--propagation", "private", "debootstrap", "--variant=minbase",
              f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR], "debootstrap")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file() and entry.name != "lock":
                    entry.unlink()
        for entry in (rootfs / "var/cache/apt").glob("*.bin"):
            entry.unlink()
        (work / "debootstrap.done").write_text(MIRROR + "\n")


def _wheels(demo: Path) -> Path:
    key = _key({"requirements": REQUIREMENTS, "python": PYTHON_TAG, "platforms": PLATFORMS})
    final = demo / f"wheels-{key}"
    if (final / "requirements.txt").is_file():
        return final
    with _building(final) as work:
        version, impl, abi = PYTHON_TAG
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "--python-version", version, "--implementation", impl,
              "--abi", abi, *platforms, "-d", str(work), *REQUIREMENTS], "pip download")
        (work / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n")
    return final


def _venv(demo: Path, rootfs: Path, base: layout.Layer, wheels: Path) -> layout.Layer:
    key = _key({"base": base.digest, "requirements": REQUIREMENTS, "venv": VENV, "pth": "v1"})
    final = demo / f"venv-{key}"
    cached = _cached_layer(final)
    if cached is not None:
        return cached
    inside = rootfs / "tmp" / "camg-wheels"
    try:
        with _building(final) as work:
            shutil.rmtree(rootfs / VENV.lstrip("/"), ignore_errors=True)
            shutil.rmtree(inside, ignore_errors=True)
            shutil.copytree(wheels, inside)
            # Trusted packages, operator step: a chroot with no network (its
            # own empty net namespace) and a private mount namespace.
            chroot = ["unshare", "--mount", "--net", "--propagation", "private", "chroot", str(rootfs)]
            _run([*chroot, "/usr/bin/python3", "-m", "venv", VENV], "python3 -m venv", env=CHROOT_ENV)
            _run([*chroot, f"{VENV}/bin/python", "-m", "pip", "install", "--quiet", "--no-index",
                  "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                  "--find-links", "/tmp/camg-wheels", "-r", "/tmp/camg-wheels/requirements.txt"],
                 "pip install", env=CHROOT_ENV)
            site = rootfs / VENV.lstrip("/") / "lib" / "python3.11" / "site-packages"
            (site / "testbed.pth").write_text(f"{WORKSPACE}/src\n")
            os.chmod(site / "testbed.pth", 0o644)
            (rootfs / WORKSPACE.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
            layer = layout.layer_from_tree(rootfs, work / "layer.tar.gz",
                                           include=(VENV.lstrip("/"), WORKSPACE.lstrip("/")))
            _finish_layer(work, layer)
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    return _cached_layer(final)


# --- the SWE-smith-shaped flavour ---------------------------------------------
#
# Laid out like a SWE-smith image: the repository cloned at /testbed with its
# own history, installed editable into an environment that the profiles'
# test command activates (``source /opt/miniconda3/bin/activate; conda
# activate testbed``), and untracked build artifacts left in the clone.
# Conda itself cannot be installed from the package registries, so
# /opt/miniconda3/bin/activate is a small stand-in: it defines ``conda
# activate``/``deactivate`` over environments under /opt/miniconda3/envs,
# each a venv. Nothing puts the environment on PATH until it is activated.

SWESMITH_NAME = "camg/demo-apispec-6.8.1-swesmith"
SWESMITH_REPOSITORY = "camg/demo-apispec-swesmith"
CONDA_ROOT = "/opt/miniconda3"
CONDA_ENV = f"{CONDA_ROOT}/envs/testbed"
BUILD_REQUIREMENTS = ("flit-core==3.12.0",)      # apispec's build backend (flit_core<4)
SWESMITH_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8")
CONDA_ACTIVATE = """\
# camg stand-in for conda's activation script (conda is not installable from
# the package registries). Source it, then `conda activate NAME`: NAME is an
# environment under /opt/miniconda3/envs (a venv). Only activate/deactivate.
export CONDA_EXE=/opt/miniconda3/bin/conda CONDA_SHLVL=0
case ":$PATH:" in *:/opt/miniconda3/bin:*) ;; *) export PATH="/opt/miniconda3/bin:$PATH";; esac
conda() {
  case "${1-}" in
    activate)
      local name="${2-base}" prefix
      if [ "$name" = base ]; then prefix=/opt/miniconda3; else prefix="/opt/miniconda3/envs/$name"; fi
      if [ ! -d "$prefix" ]; then
        echo "EnvironmentNameNotFound: Could not find conda environment: $name" >&2
        return 1
      fi
      if [ "$prefix" != /opt/miniconda3 ]; then
        VIRTUAL_ENV_DISABLE_PROMPT=1 . "$prefix/bin/activate" || return 1
      fi
      export CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$name" CONDA_SHLVL=1
      ;;
    deactivate)
      if command -v deactivate >/dev/null 2>&1; then deactivate; fi
      unset CONDA_PREFIX CONDA_DEFAULT_ENV
      export CONDA_SHLVL=0
      ;;
    *)
      echo "conda (camg stand-in): only 'conda activate' and 'conda deactivate'" >&2
      return 2
      ;;
  esac
}
"""


def _build_wheels(demo: Path) -> Path:
    key = _key({"requirements": BUILD_REQUIREMENTS})
    final = demo / f"build-wheels-{key}"
    if (final / "requirements.txt").is_file():
        return final
    with _building(final) as work:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "-d", str(work), *BUILD_REQUIREMENTS],
             "pip download (build backend)")
        (work / "requirements.txt").write_text("\n".join(BUILD_REQUIREMENTS) + "\n")
    return final


def _base_repo(sdist: Path, dest: Path) -> str:
    """The demo project's repository as environments.coding.demo.demo_tasks.build makes
    its mirror's base commit (same files, identity and dates: same commit)."""
    from environments.coding.demo import demo_tasks

    demo_tasks.extract_sdist(sdist, dest)
    (dest / ".gitignore").write_text(demo_tasks.GITIGNORE)
    version = sdist.name.removesuffix(".tar.gz").rpartition("-")[2]
    for args in (("init", "-q", "--template=", "-b", "main"), ("add", "-A", "-f"),
                 ("commit", "-q", "-m", f"apispec {version} from its sdist")):
        demo_tasks._git(dest, *args)
    return demo_tasks._git(dest, "rev-parse", "HEAD").strip()


def _swesmith(demo: Path, rootfs: Path, base: layout.Layer, wheels: Path) -> layout.Layer:
    from environments.coding.demo import demo_tasks

    sdist = demo_tasks.fetch_sdist(demo / "sdist")
    build = _build_wheels(demo)
    key = _key({"base": base.digest, "requirements": REQUIREMENTS, "build": BUILD_REQUIREMENTS,
                "sdist": sdist.name, "activate": CONDA_ACTIVATE, "layout": "v1"})
    final = demo / f"swesmith-{key}"
    cached = _cached_layer(final)
    if cached is not None:
        return cached
    inside = rootfs / "tmp" / "camg-wheels"
    owned = (CONDA_ROOT.lstrip("/"), WORKSPACE.lstrip("/"))
    try:
        with _building(final) as work:
            for rel in owned:
                shutil.rmtree(rootfs / rel, ignore_errors=True)
            shutil.rmtree(inside, ignore_errors=True)
            shutil.copytree(wheels, inside)
            for wheel in build.glob("*.whl"):
                shutil.copy(wheel, inside)
            # The clone: the same base commit the demo mirror has (same sdist,
            # same fixed identity and dates), so it is this project's history.
            testbed = rootfs / WORKSPACE.lstrip("/")
            _base_repo(sdist, testbed)
            chroot = ["unshare", "--mount", "--net", "--propagation", "private", "chroot", str(rootfs)]
            _run([*chroot, "/usr/bin/python3", "-m", "venv", CONDA_ENV], "venv", env=CHROOT_ENV)
            pip = [*chroot, f"{CONDA_ENV}/bin/python", "-m", "pip", "install", "--quiet",
                   "--no-index", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                   "--find-links", "/tmp/camg-wheels"]
            _run([*pip, "-r", "/tmp/camg-wheels/requirements.txt", *BUILD_REQUIREMENTS],
                 "pip install (env)", env=CHROOT_ENV)
            # SWE-smith's install_cmds: `python -m pip install -e .` in /testbed.
            _run([*pip, "--no-build-isolation", "-e", WORKSPACE], "pip install -e /testbed",
                 env=CHROOT_ENV)
            # Build artifacts the clone keeps untracked (SWE-smith images carry
            # egg-info, compiled extensions, bytecode): byte-compiled sources.
            _run([*chroot, f"{CONDA_ENV}/bin/python", "-m", "compileall", "-q",
                  f"{WORKSPACE}/src"], "compileall", env=CHROOT_ENV)
            activate = rootfs / CONDA_ROOT.lstrip("/") / "bin" / "activate"
            activate.parent.mkdir(parents=True, exist_ok=True)
            activate.write_text(CONDA_ACTIVATE)
            os.chmod(activate, 0o644)
            layer = layout.layer_from_tree(rootfs, work / "layer.tar.gz", include=owned)
            _finish_layer(work, layer)
    finally:
        shutil.rmtree(inside, ignore_errors=True)
        # The shared build rootfs goes back to what the plain flavour expects.
        for rel in owned:
            shutil.rmtree(rootfs / rel, ignore_errors=True)
        (rootfs / WORKSPACE.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
    return _cached_layer(final)


def build_demo(cache_root: Path, flavor: str = "plain") -> DemoBuild:
    """The demo image as an OCI layout under ``cache_root``/demo (cached).

    ``flavor``: "plain" (the test venv at /opt/testbed-venv, an empty
    /testbed) or "swesmith" (laid out like a SWE-smith image, see above).
    """
    if flavor not in FLAVORS:
        raise DatasetError(f"demo image: unknown flavour {flavor!r}")
    demo = Path(cache_root).absolute() / "demo"
    with locked(demo / "lock"):
        shutil.rmtree(demo / "tmp", ignore_errors=True)
        (demo / "tmp").mkdir(parents=True)
        rootfs, base = _base(demo)
        if flavor == "swesmith":
            return _swesmith_build(demo, rootfs, base)
        venv = _venv(demo, rootfs, base, _wheels(demo))
        layers = (base, venv)
        config = layout.image_config(
            layers, env=ENV, working_dir=WORKSPACE,
            labels={"org.opencontainers.image.title": NAME,
                    "camg.demo.requirements": ",".join(REQUIREMENTS)},
            history=(f"debootstrap --variant=minbase --include={','.join(BASE_PACKAGES)} {SUITE}",
                     f"python3 -m venv {VENV} && pip install apispec[tests] pins"))
        out = demo / f"layout-{_key([base.digest, venv.digest, sha256_json(config.decode())])}"
        digest_file = out / "digest"
        if not digest_file.is_file():
            shutil.rmtree(out, ignore_errors=True)
            digest = layout.write_layout(out, layers, config, TAG)
            digest_file.write_text(digest + "\n")
        return DemoBuild(out, TAG, digest_file.read_text().strip(), layers)


def _swesmith_build(demo: Path, rootfs: Path, base: layout.Layer) -> DemoBuild:
    layer = _swesmith(demo, rootfs, base, _wheels(demo))
    layers = (base, layer)
    config = layout.image_config(
        layers, env=SWESMITH_ENV, working_dir=WORKSPACE,
        labels={"org.opencontainers.image.title": SWESMITH_NAME,
                "camg.demo.requirements": ",".join(REQUIREMENTS + BUILD_REQUIREMENTS)},
        history=(f"debootstrap --variant=minbase --include={','.join(BASE_PACKAGES)} {SUITE}",
                 f"git clone (base commit) /testbed; venv {CONDA_ENV}; pip install -e /testbed; "
                 "conda activation stand-in"))
    out = demo / f"layout-swesmith-{_key([base.digest, layer.digest, sha256_json(config.decode())])}"
    digest_file = out / "digest"
    if not digest_file.is_file():
        shutil.rmtree(out, ignore_errors=True)
        digest = layout.write_layout(out, layers, config, TAG)
        digest_file.write_text(digest + "\n")
    return DemoBuild(out, TAG, digest_file.read_text().strip(), layers, "swesmith")


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
