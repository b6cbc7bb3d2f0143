"""The image builder: a repository's test image from Debian and PyPI packages, without Docker.

One builder makes every image of this kind: the Coding demo's two images
(tools/oci_demo.py holds their specs) and any repository an operator adds
(``python -m tools.prepare_image --spec SPEC.json``). A spec
(:class:`ImageBuildSpec`, JSON with the same field names) names:

* the repository: a PyPI sdist (``"sdist": "name==version"``, optionally its
  ``sha256``) or a git repository on this machine at a commit
  (``"git": PATH, "commit": 40 hex``);
* the install spec, with SWE-smith's profile fields: ``python`` (what Debian
  bookworm offers: 3.11; anything else is refused), ``pip_packages`` (the
  test environment, every package pinned ``name==version`` and the set
  resolved whole: nothing is resolved at build time), ``build_packages``
  (pinned wheels the install commands' build backends need; the build has
  no network), ``install_cmds`` (run in /testbed with the environment
  activated, pip pointed at the pinned wheels), ``test_cmd`` (run once on
  the built tree: a build whose test command cannot start is refused);
* the layout: ``"swesmith"`` (default) lays /testbed out as SWE-smith does:
  a git clone of the repository with its history, installed into
  /opt/miniconda3/envs/testbed, activated with ``source
  /opt/miniconda3/bin/activate; conda activate testbed`` (a stand-in for
  conda's script, since conda is not installable from the package
  registries: it activates a venv), byte-compiled ``compile`` paths left
  untracked. ``"venv"`` is the demo's first layout: a venv at ``venv``
  (on PATH), ``.pth`` entries naming source directories, an empty
  /testbed for the service to fill.

Two layers: a ``debootstrap --variant=minbase`` bookworm rootfs with
python3, python3-venv, git, patch and ca-certificates (shared by every
image: one debootstrap per cache) and the image's own layer, built in a
copy of that rootfs, in a chroot with no network (its own empty net
namespace) and a private mount namespace. The layer holds only what the
layout owns (/opt/miniconda3 and /testbed; the venv and /testbed): what the
install commands write elsewhere is not kept. Every step is cached under
``<cache_root>/demo`` (named for the first images it built; renaming it
would cost every cache its Debian base and every image its digest), keyed
by its inputs, so a rebuild with the same spec is the same image.

Where this lives: product build code, shipped in the wheel (tools*), and
loaded by no service: camg/ imports nothing of tools/ ("camg/ knows no
environment"), the services import no tools/oci (import-linter), and the
environments' demos build on it (General, Visual and AutoResearch put their
layers on this base), so it cannot sit in one environment's build/ without
making the environments depend on each other. Hence the command line is
``python -m tools.prepare_image``, not ``python -m camg.prepare_image``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from camg import typed
from camg.errors import ConfigError, DatasetError
from camg.config.hashing import sha256_file, sha256_json
from tools.oci import layout
from tools.oci.apply import extract_tree

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "git", "patch", "ca-certificates")
#: the Python every image runs: bookworm's python3
PYTHON = "3.11"
# bookworm's python3 and glibc (2.36); pip does not widen a given --platform
# to older manylinux tags itself, so they are listed.
PYTHON_TAG = ("3.11", "cp", "cp311")
PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
BASE_LAYER_VERSION = 2
BUILD_DIR = "demo"
WORKSPACE = "/testbed"
VENV = "/opt/testbed-venv"
CONDA_ROOT = "/opt/miniconda3"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHROOT_ENV = {"PATH": SYSTEM_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
WHEELS_INSIDE = "/tmp/camg-wheels"
LAYOUTS = ("swesmith", "venv")
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
# The repository made from an sdist: the same files, identity and dates as
# environments/coding/demo/demo_tasks.py gives its mirror's base commit, so
# the image's clone and the task mirror share that commit
# (tests/unit/test_image_build.py holds the two together).
GITIGNORE = "__pycache__/\n*.py[cod]\n*.egg-info/\n.pytest_cache/\nbuild/\ndist/\n.tox/\n"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "camg demo",
    "GIT_AUTHOR_EMAIL": "demo@camg.invalid",
    "GIT_COMMITTER_NAME": "camg demo",
    "GIT_COMMITTER_EMAIL": "demo@camg.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
# Keys of the first images (the demo's) are kept: a field added later enters
# a layer's key only when it differs from what those builds did.
_LEGACY_INSTALL = ("python -m pip install --no-build-isolation --no-deps -e .",)
_LEGACY_COMPILE = ("src",)
_LEGACY_PTH = ("/testbed/src",)
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9._+!-]+")
_SDIST = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9._+!-]+)")
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REPOSITORY = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*")
_IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_DEBIAN = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def _relative(value: str, what: str) -> str:
    parts = value.split("/")
    if not value or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what} {value!r} must be a plain relative path inside /testbed")
    return value


@dataclasses.dataclass(frozen=True)
class Source:
    """Where /testbed's repository comes from: exactly one of an sdist on
    PyPI and a git repository on this machine at a commit."""

    sdist: str = ""
    sha256: str = ""
    git: str = ""
    commit: str = ""

    def __post_init__(self) -> None:
        if bool(self.sdist) == bool(self.git):
            raise ValueError("source: give exactly one of sdist ('name==version') and git")
        if self.sdist:
            if not _SDIST.fullmatch(self.sdist):
                raise ValueError(f"source.sdist {self.sdist!r} must be 'name==version' (pinned)")
            if self.commit:
                raise ValueError("source.commit belongs to a git source")
            if self.sha256 and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
                raise ValueError("source.sha256 must be 64 lowercase hex digits")
        else:
            if not re.fullmatch(r"[0-9a-f]{40}", self.commit):
                raise ValueError("source.commit: a git source needs the full 40-hex commit")
            if self.sha256:
                raise ValueError("source.sha256 belongs to an sdist source")

    def describe(self) -> str:
        return self.sdist if self.sdist else f"{self.git}@{self.commit[:12]}"


@dataclasses.dataclass(frozen=True)
class ImageBuildSpec:
    """What to build (see the module docstring); JSON uses the same names."""

    name: str
    repository: str
    tag: str
    test_cmd: str = ""
    python: str = PYTHON
    layout: str = "swesmith"
    source: Source | None = None
    pip_packages: tuple[str, ...] = ()
    build_packages: tuple[str, ...] = ()
    install_cmds: tuple[str, ...] = ()
    compile: tuple[str, ...] = ()
    env_name: str = "testbed"
    #: venv layout: where the venv is and what its testbed.pth names
    venv: str = VENV
    pth: tuple[str, ...] = ()
    debian_packages: tuple[str, ...] = ()
    #: the image config's labels and history (default: derived from the spec)
    labels: Mapping[str, str] | None = None
    history: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not _IMAGE_NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} is not a valid image name")
        if not _REPOSITORY.fullmatch(self.repository):
            raise ValueError(f"repository {self.repository!r} must be a lowercase registry path "
                             "without host, tag or digest (e.g. 'camg/parse')")
        if not _TAG.fullmatch(self.tag):
            raise ValueError(f"tag {self.tag!r} is not a valid tag")
        if self.python != PYTHON:
            raise ValueError(
                f"python {self.python!r} is not available: images are built from Debian "
                f"{SUITE}, whose python3 is {PYTHON}; give \"python\": \"{PYTHON}\" (a SWE-smith "
                "profile asking for another version needs its pins checked on "
                f"{PYTHON})")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} must be one of {', '.join(LAYOUTS)}")
        if not self.pip_packages:
            raise ValueError("pip_packages: list the test environment, every package pinned")
        for field in ("pip_packages", "build_packages"):
            values = getattr(self, field)
            for i, pin in enumerate(values):
                if not _PIN.fullmatch(pin):
                    raise ValueError(f"{field}[{i}] {pin!r} is not pinned as name==version "
                                     "(resolve the set once and list every package)")
            names = [_canonical(p) for p in values]
            if len(set(names)) != len(names):
                raise ValueError(f"{field}: a package is listed twice")
        if set(map(_canonical, self.pip_packages)) & set(map(_canonical, self.build_packages)):
            raise ValueError("build_packages: a package is also in pip_packages")
        for i, pkg in enumerate(self.debian_packages):
            if not _DEBIAN.fullmatch(pkg):
                raise ValueError(f"debian_packages[{i}] {pkg!r} is not a Debian package name")
        for i, cmd in enumerate(self.install_cmds):
            if not cmd.strip() or "\n" in cmd:
                raise ValueError(f"install_cmds[{i}] must be a non-empty one-line command")
        for i, path in enumerate(self.compile):
            _relative(path, f"compile[{i}]")
        if self.layout == "swesmith":
            if self.source is None:
                raise ValueError("source: the swesmith layout clones a repository at /testbed")
            if not self.test_cmd.strip():
                raise ValueError("test_cmd: the profile's test command is required (the build "
                                 "runs it once)")
            if not _ENV_NAME.fullmatch(self.env_name):
                raise ValueError(f"env_name {self.env_name!r} is not a conda environment name")
            if self.pth:
                raise ValueError("pth belongs to the venv layout")
        else:
            for field in ("source", "install_cmds", "compile", "test_cmd"):
                if getattr(self, field):
                    raise ValueError(f"{field}: the venv layout lays no repository "
                                     "(it belongs to the swesmith layout)")
            if not self.venv.startswith("/opt/") or ".." in self.venv.split("/"):
                raise ValueError(f"venv {self.venv!r} must be a directory under /opt")
            for i, entry in enumerate(self.pth):
                if not entry.startswith(WORKSPACE + "/"):
                    raise ValueError(f"pth[{i}] {entry!r} must name a directory below /testbed")

    @property
    def env_prefix(self) -> str:
        return f"{CONDA_ROOT}/envs/{self.env_name}" if self.layout == "swesmith" else self.venv

    @property
    def owned(self) -> tuple[str, ...]:
        """The top directories the image's layer holds."""
        top = CONDA_ROOT if self.layout == "swesmith" else self.venv
        return (top.lstrip("/"), WORKSPACE.lstrip("/"))

    @property
    def wheel_pins(self) -> tuple[str, ...]:
        return self.pip_packages + self.build_packages

    @property
    def base_packages(self) -> tuple[str, ...]:
        return BASE_PACKAGES + tuple(p for p in self.debian_packages if p not in BASE_PACKAGES)

    @property
    def env(self) -> tuple[str, ...]:
        """The image config's Env."""
        if self.layout == "swesmith":
            # Nothing is on PATH until the profile's command activates it.
            return (f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8")
        return (f"PATH={self.venv}/bin:{SYSTEM_PATH}", "LANG=C.UTF-8", f"VIRTUAL_ENV={self.venv}")


def _canonical(pin: str) -> str:
    return re.sub(r"[-_.]+", "-", pin.partition("==")[0].split("[")[0]).lower()


def parse_spec(doc: object, where: str = "spec") -> ImageBuildSpec:
    """A checked spec from JSON; ConfigError naming the field."""
    return typed.parse(ImageBuildSpec, doc, where, ConfigError)


def load_spec(path: str | os.PathLike) -> ImageBuildSpec:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: image spec not found") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a JSON image spec ({exc})") from None
    return parse_spec(doc, str(path))


@dataclasses.dataclass(frozen=True)
class Build:
    """A built image: an OCI layout holding it, by digest."""

    layout: Path
    tag: str
    digest: str
    layers: tuple[layout.Layer, ...]
    flavor: str = "plain"
    #: the repository at /testbed: its sdist (when it came from one) and HEAD
    sdist: Path | None = None
    commit: str = ""


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


def _run(argv: list[str], what: str, timeout: float = 1800, env: dict | None = None,
         cwd: str | os.PathLike | None = None) -> str:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, env=env, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise DatasetError(f"image build: {what} took longer than {timeout:.0f} s") from None
    output = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise DatasetError(f"image build: {what} failed (exit {proc.returncode}): "
                           f"{output[-3000:]}")
    return output


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


# -- the Debian base ------------------------------------------------------------

def _base(bdir: Path, packages: tuple[str, ...] = BASE_PACKAGES) -> tuple[Path, layout.Layer]:
    """The debootstrap'd rootfs and its layer (cached; call under the build lock)."""
    key = _key({"suite": SUITE, "mirror": MIRROR, "variant": "minbase", "include": packages})
    final = bdir / f"base-{key}"
    rootfs = final / "rootfs"
    if not (final / "debootstrap.done").is_file():
        _debootstrap(final, packages)
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
    # Images put these in their own layer (older builders built them inside
    # this very tree).
    later = (VENV.lstrip("/"), WORKSPACE.lstrip("/"), CONDA_ROOT.lstrip("/"))
    layer = layout.layer_from_tree(rootfs, layer_dir / "layer.tar.gz", exclude=devices + later)
    return rootfs, _finish_layer(layer_dir, layer)


def _debootstrap(final: Path, packages: tuple[str, ...]) -> None:
    with _building(final) as work:
        rootfs = work / "rootfs"
        # A private mount namespace: whatever debootstrap mounts in the
        # target (proc, sys) disappears with it, even when it fails.
        _run(["unshare", "--mount", "--propagation", "private", "debootstrap", "--variant=minbase",
              f"--include={','.join(packages)}", SUITE, str(rootfs), MIRROR], "debootstrap")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file() and entry.name != "lock":
                    entry.unlink()
        for entry in (rootfs / "var/cache/apt").glob("*.bin"):
            entry.unlink()
        (work / "debootstrap.done").write_text(MIRROR + "\n")


# -- wheels and sources ------------------------------------------------------------

def _wheels(bdir: Path, pins: tuple[str, ...]) -> Path:
    """Every pinned wheel for bookworm's Python, downloaded once (no dependency resolution)."""
    key = _key({"requirements": pins, "python": PYTHON_TAG, "platforms": PLATFORMS})
    final = bdir / f"wheels-{key}"
    if (final / "requirements.txt").is_file():
        return final
    with _building(final) as work:
        version, impl, abi = PYTHON_TAG
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "--python-version", version, "--implementation",
              impl, "--abi", abi, *platforms, "-d", str(work), *pins], "pip download")
        (work / "requirements.txt").write_text("\n".join(pins) + "\n")
    return final


def sdist_name(path: Path) -> tuple[str, str]:
    """(project, version) from an sdist's file name."""
    project, _, version = path.name.removesuffix(".tar.gz").rpartition("-")
    return project, version


def fetch_sdist(directory: Path, source: Source) -> Path:
    """The sdist ``source`` names, downloaded once into ``directory``
    (``pip download --no-deps --no-binary :all:``), its sha256 checked when pinned."""
    name, _, version = source.sdist.partition("==")
    directory.mkdir(parents=True, exist_ok=True)
    wanted = {f"{n}-{version}.tar.gz".lower() for n in
              (name, name.replace("-", "_"), name.replace("_", "-"), name.replace(".", "_"))}
    found = [p for p in directory.iterdir() if p.name.lower() in wanted]
    if not found:
        with tempfile.TemporaryDirectory(prefix="sdist.", dir=directory) as tmp:
            _run([sys.executable, "-m", "pip", "download", "-qq", "--disable-pip-version-check",
                  "--no-deps", "--no-binary", ":all:", source.sdist, "-d", tmp],
                 f"pip download {source.sdist}")
            got = [p for p in Path(tmp).iterdir() if p.name.endswith(".tar.gz")]
            if len(got) != 1:
                raise DatasetError(f"image build: pip download {source.sdist} gave "
                                   f"{sorted(p.name for p in Path(tmp).iterdir())}, "
                                   "not one .tar.gz sdist")
            os.replace(got[0], directory / got[0].name)
            found = [directory / got[0].name]
    path = found[0]
    if source.sha256:
        actual = sha256_file(path).split(":", 1)[1]
        if actual != source.sha256:
            raise DatasetError(f"image build: {path.name} has sha256 {actual}, the spec pins "
                               f"{source.sha256}")
    return path


def extract_sdist(sdist: Path, dest: Path) -> None:
    """Unpack an sdist without its top-level directory, refusing unsafe members."""
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        top = {m.name.split("/", 1)[0] for m in members}
        if len(top) != 1:
            raise DatasetError(f"{sdist}: expected one top-level directory, found {sorted(top)}")
        prefix = top.pop() + "/"
        inner = []
        for member in members:
            if member.name.startswith(prefix) and member.name != prefix:
                member.name = member.name[len(prefix):]
                inner.append(member)
        extract_tree(tar, dest, what=str(sdist), members=inner)


def _git(repo: Path, *args: str) -> str:
    return _run(["git", "-C", str(repo), *args], f"git {' '.join(args[:2])}",
                env={**os.environ, **GIT_ENV})


def sdist_repository(sdist: Path, dest: Path) -> str:
    """``dest``: a repository whose one commit is the sdist's files (the
    base commit the task builder gives its mirror); returns that commit."""
    project, version = sdist_name(sdist)
    extract_sdist(sdist, dest)
    (dest / ".gitignore").write_text(GITIGNORE)
    _git(dest, "init", "-q", "--template=", "-b", "main")
    _git(dest, "add", "-A", "-f")
    _git(dest, "commit", "-q", "-m", f"{project} {version} from its sdist")
    return _git(dest, "rev-parse", "HEAD").strip()


def git_repository(url: str, commit: str, dest: Path) -> str:
    """``dest``: a clone of ``url`` at ``commit`` (its history, on branch
    main, no remote, no other ref), made without running anything of the
    repository (no template, hooks or system and global config)."""
    source = url if "://" in url else os.path.abspath(url)
    dest.mkdir(parents=True)
    _git(dest, "init", "-q", "--template=", "-b", "main")
    _git(dest, "fetch", "-q", "--no-tags", source, commit)
    _git(dest, "reset", "-q", "--hard", commit)
    _git(dest, "reflog", "expire", "--expire=now", "--all")
    _git(dest, "gc", "-q", "--prune=now")
    head = _git(dest, "rev-parse", "HEAD").strip()
    if head != commit:
        raise DatasetError(f"image build: {url} at {commit} checked out {head}")
    return head


# -- the image's layer --------------------------------------------------------------

def layer_key(spec: ImageBuildSpec, base: layout.Layer, sdist: Path | None) -> dict:
    """What the image's layer is keyed by (see _LEGACY_*: the demo's keys)."""
    key: dict[str, object]
    if spec.layout == "venv":
        key = {"base": base.digest, "requirements": spec.pip_packages, "venv": spec.venv,
               "pth": "v1"}
        if spec.pth != _LEGACY_PTH:
            key["pth_entries"] = spec.pth
        if spec.build_packages:
            key["build"] = spec.build_packages
        return key
    assert spec.source is not None  # checked by the spec
    key = {"base": base.digest, "requirements": spec.pip_packages, "build": spec.build_packages}
    if sdist is not None:
        key["sdist"] = sdist.name
        if spec.source.sha256:
            key["sdist_sha256"] = spec.source.sha256
    else:
        key["git"] = {"url": spec.source.git, "commit": spec.source.commit}
    key.update({"activate": CONDA_ACTIVATE, "layout": "v1"})
    if spec.install_cmds != _LEGACY_INSTALL:
        key["install"] = spec.install_cmds
    if spec.compile != _LEGACY_COMPILE:
        key["compile"] = spec.compile
    if spec.env_name != "testbed":
        key["env_name"] = spec.env_name
    return key


@contextlib.contextmanager
def _scratch_rootfs(bdir: Path, rootfs: Path) -> Iterator[Path]:
    """A copy of the base rootfs to build in (the shared one stays as debootstrap left it)."""
    with tempfile.TemporaryDirectory(prefix="rootfs.", dir=bdir / "tmp") as scratch:
        tree = Path(scratch) / "rootfs"
        _run(["cp", "-a", "--reflink=auto", str(rootfs), str(tree)], "copying the base rootfs")
        yield tree


def _chroot(tree: Path, argv: list[str], what: str, timeout: float = 1800) -> str:
    # Trusted packages, operator step: a chroot with no network (its own
    # empty net namespace) and a private mount namespace.
    return _run(["unshare", "--mount", "--net", "--propagation", "private", "chroot", str(tree),
                 *argv], what, timeout=timeout, env=CHROOT_ENV)


def _in_env(spec: ImageBuildSpec, command: str) -> list[str]:
    """``command`` run by bash in /testbed with the environment activated."""
    if spec.layout == "swesmith":
        activate = f"source {CONDA_ROOT}/bin/activate && conda activate {spec.env_name}"
    else:
        activate = f"source {spec.venv}/bin/activate"
    return ["/bin/bash", "-c", f"set -e; {activate}; cd {WORKSPACE}; {command}"]


def _pip_offline(command: str) -> str:
    # pip in the install commands sees only the pinned wheels.
    return (f"export PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS_INSIDE} PIP_NO_CACHE_DIR=1 "
            f"PIP_DISABLE_PIP_VERSION_CHECK=1; {command}")


def _image_layer(bdir: Path, rootfs: Path, base: layout.Layer,
                 spec: ImageBuildSpec) -> tuple[layout.Layer, Path | None, str]:
    """The image's own layer (cached): (layer, sdist, /testbed's HEAD or "")."""
    sdist = None
    if spec.source is not None and spec.source.sdist:
        sdist = fetch_sdist(bdir / "sdist", spec.source)
    prefix = "swesmith" if spec.layout == "swesmith" else "venv"
    final = bdir / f"{prefix}-{_key(layer_key(spec, base, sdist))}"
    cached = _cached_layer(final)
    if cached is not None:
        commit = (final / "commit").read_text().strip() if (final / "commit").is_file() else ""
        return cached, sdist, commit
    wheels = _wheels(bdir, spec.wheel_pins)
    env = spec.env_prefix
    commit = ""
    with _building(final) as work, _scratch_rootfs(bdir, rootfs) as tree:
        for rel in spec.owned:
            shutil.rmtree(tree / rel, ignore_errors=True)
        shutil.copytree(wheels, tree / WHEELS_INSIDE.lstrip("/"))
        testbed = tree / WORKSPACE.lstrip("/")
        if spec.source is not None:
            if sdist is not None:
                commit = sdist_repository(sdist, testbed)
            else:
                commit = git_repository(spec.source.git, spec.source.commit, testbed)
        else:
            testbed.mkdir(mode=0o755)
        _chroot(tree, ["/usr/bin/python3", "-m", "venv", env], f"python3 -m venv {env}")
        _chroot(tree, [f"{env}/bin/python", "-m", "pip", "install", "--quiet", "--no-index",
                       "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                       "--find-links", WHEELS_INSIDE, "-r", f"{WHEELS_INSIDE}/requirements.txt"],
                "pip install (pinned wheels)")
        if spec.layout == "swesmith":
            activate = tree / CONDA_ROOT.lstrip("/") / "bin" / "activate"
            activate.parent.mkdir(parents=True, exist_ok=True)
            activate.write_text(CONDA_ACTIVATE)
            os.chmod(activate, 0o644)
        for cmd in spec.install_cmds:
            _chroot(tree, _in_env(spec, _pip_offline(cmd)), f"install command {cmd!r}")
        _chroot(tree, [f"{env}/bin/python", "-m", "pip", "check"],
                "pip check (a dependency missing from pip_packages?)")
        # Build artifacts the clone keeps untracked (SWE-smith images carry
        # egg-info, compiled extensions, bytecode): byte-compiled sources.
        for path in spec.compile:
            _chroot(tree, [f"{env}/bin/python", "-m", "compileall", "-q",
                           f"{WORKSPACE}/{path}"], f"compileall {path}")
        if spec.layout == "venv":
            site = tree / env.lstrip("/") / "lib" / f"python{PYTHON}" / "site-packages"
            (site / "testbed.pth").write_text("".join(f"{entry}\n" for entry in spec.pth))
            os.chmod(site / "testbed.pth", 0o644)
        layer = layout.layer_from_tree(tree, work / "layer.tar.gz", include=spec.owned)
        if spec.test_cmd:
            # After the layer is taken: what the run writes is not kept.
            check_test_run(_chroot_output(tree, spec.test_cmd), spec.test_cmd)
        if commit:
            (work / "commit").write_text(commit + "\n")
        _finish_layer(work, layer)
    built = _cached_layer(final)
    assert built is not None  # written by _finish_layer, moved to final by _building
    return built, sdist, commit


def _chroot_output(tree: Path, command: str) -> tuple[int, str]:
    argv = ["unshare", "--mount", "--net", "--propagation", "private", "chroot", str(tree),
            "/bin/bash", "-c", f"cd {WORKSPACE} && {command}"]
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800,
                              env=CHROOT_ENV, check=False)
    except subprocess.TimeoutExpired:
        raise DatasetError("image build: the test command took longer than 1800 s") from None
    return proc.returncode, proc.stdout.decode(errors="replace")


_OUTCOME = re.compile(r"^\S+\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL)", re.MULTILINE)


def check_test_run(result: tuple[int, str], command: str) -> int:
    """The built tree's test run (exit status, output) started the runner and
    ran tests: pytest's exit 0 or 1 with at least one passing test; returns
    how many passed. Else DatasetError with the end of its output."""
    code, output = result
    passed = sum(1 for m in _OUTCOME.finditer(output) if m.group(1) == "PASSED")
    if code in (0, 1) and passed:
        return passed
    raise DatasetError(
        f"image build: the test command does not run in the built image (exit {code}, "
        f"{passed} passed): {command!r}; its output ends: {output[-2500:]}")


# -- the whole image -------------------------------------------------------------------

def image_config(spec: ImageBuildSpec, layers: tuple[layout.Layer, ...]) -> bytes:
    labels = dict(spec.labels) if spec.labels is not None else {
        "org.opencontainers.image.title": spec.name,
        "camg.image.requirements": ",".join(spec.wheel_pins),
    }
    if spec.history is not None:
        history = spec.history
    else:
        first = f"debootstrap --variant=minbase --include={','.join(spec.base_packages)} {SUITE}"
        if spec.layout == "swesmith":
            assert spec.source is not None
            second = (f"{WORKSPACE}: {spec.source.describe()}; venv {spec.env_prefix}; "
                      f"{'; '.join(spec.install_cmds) or 'no install command'}; "
                      "conda activation stand-in")
        else:
            second = f"python3 -m venv {spec.venv} && pip install pinned wheels"
        history = (first, second)
    return layout.image_config(layers, env=spec.env, working_dir=WORKSPACE, labels=labels,
                               history=history)


def build_image(spec: ImageBuildSpec, cache_root: str | os.PathLike) -> Build:
    """The image as an OCI layout under ``cache_root``/demo (every step cached)."""
    bdir = Path(cache_root).absolute() / BUILD_DIR
    with locked(bdir / "lock"):
        shutil.rmtree(bdir / "tmp", ignore_errors=True)
        (bdir / "tmp").mkdir(parents=True)
        rootfs, base = _base(bdir, spec.base_packages)
        layer, sdist, commit = _image_layer(bdir, rootfs, base, spec)
        layers = (base, layer)
        config = image_config(spec, layers)
        prefix = "layout-swesmith" if spec.layout == "swesmith" else "layout"
        out = bdir / f"{prefix}-{_key([base.digest, layer.digest, sha256_json(config.decode())])}"
        digest_file = out / "digest"
        if not digest_file.is_file():
            shutil.rmtree(out, ignore_errors=True)
            digest = layout.write_layout(out, layers, config, spec.tag)
            digest_file.write_text(digest + "\n")
        flavor = "swesmith" if spec.layout == "swesmith" else "plain"
        return Build(out, spec.tag, digest_file.read_text().strip(), layers, flavor, sdist, commit)


def build_record(spec: ImageBuildSpec, build: Build, repository: str) -> dict:
    """What tools.prepare_image writes beside the images file (build.json)."""
    return {
        "name": spec.name, "repository": repository, "digest": build.digest, "tag": build.tag,
        "layout": str(build.layout), "layers": [layer.to_json() for layer in build.layers],
        "sdist": str(build.sdist) if build.sdist else None,
        "sdist_sha256": sha256_file(build.sdist) if build.sdist else None,
        "commit": build.commit or None, "test_cmd": spec.test_cmd or None,
        "spec": typed.to_json(spec),
    }
