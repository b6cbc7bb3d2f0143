"""Building Coding's task layers: preparation only, as root.

``python -m camg.prepare --environment coding`` (environments/coding/prepare.py)
calls ``build_layers_as_root`` for every task; the service only checks what
it built (environments.coding.layers.verified) and import-linter forbids the
service's modules to import this one. What the two layers hold, and why
each whiteout, is environments/coding/layers.py's docstring.

Root is needed for the agent uid's ownership and the overlay's trusted.*
opaque markers, and git runs here as root on what an image or a mirror
ships: with none of their configuration that can run a program.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from camg.config.host_private import SERVICE_GROUP, group_id, private_dir
from camg.errors import ConfigError, PreparationMissing
from environments.coding.layers import (
    AGENT_GID,
    AGENT_UID,
    FORMAT,
    GUARD_FILE,
    PREPARE_STEP,
    PRIVATE_GIT,
    STAMP,
    WORKDIR,
    TaskLayers,
    guard_source,
    layer_dir,
    verified,
)
from environments.coding.mirrors import TaskRef, git

# Git run as root on anything an image or a mirror ships reads none of its
# configuration that can run a program: no system/global config, no hooks,
# no fsmonitor, no attributes file; trees are exported blob by blob (no
# smudge/textconv filters).
_SAFE_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": "/nonexistent",
}
_SAFE_GIT_ARGS = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "core.attributesFile=/dev/null",
    "-c",
    "safe.directory=*",
)
# A fixed identity and date make the snapshot commit a pure function of the
# tree, so rebuilding a layer reproduces the same commit id.
_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "camg",
    "GIT_AUTHOR_EMAIL": "camg@localhost",
    "GIT_COMMITTER_NAME": "camg",
    "GIT_COMMITTER_EMAIL": "camg@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
_REPO_CONFIG = (
    # The overlay changes inode/device numbers; without this every first
    # `git status` in an episode re-hashes the whole tree.
    ("core.checkStat", "minimal"),
    ("core.trustctime", "false"),
    ("gc.auto", "0"),
    ("core.logAllRefUpdates", "false"),
)


def build_layers_as_root(
    root: str | os.PathLike,
    ref: TaskRef,
    *,
    image_rootfs: str | None = None,
    image_key: str = "",
    privileged: bool = True,
) -> TaskLayers:
    """Build the task's layers when missing, then return them verified.

    Root is required. ``privileged=False`` builds without agent ownership
    and opaque markers and without root: only for tests of the git side;
    such layers are never accepted where privileged ones are asked for.
    """
    base = layer_dir(root, ref, image_key)
    if os.geteuid() == 0 or not (base / STAMP).is_file():
        # The grader layer holds the tests that decide the reward: the
        # layers root is root's and the services' only (the helper mounts
        # the layers as root). Also over layers an earlier install left open.
        private_dir(root)
    if not (base / STAMP).is_file():
        _build(base, ref, privileged, image_rootfs, image_key)
    return verified(root, ref, privileged=privileged, image_key=image_key)


def _build(
    base: Path, ref: TaskRef, privileged: bool, image_rootfs: str | None, image_key: str
) -> None:
    if privileged and os.geteuid() != 0:
        raise PreparationMissing(
            f"{ref.branch}: building task layers needs root", step=PREPARE_STEP
        )
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{base.name}.", dir=base.parent))
    try:
        tracked = image_tracked(image_rootfs) if image_rootfs else []
        if image_rootfs and not privileged:
            raise PreparationMissing(
                f"{ref.branch}: masking the image's workspace needs root", step=PREPARE_STEP
            )
        tree, snapshot = _build_agent(tmp / "agent", ref, privileged)
        _build_grader(tmp / "grader", ref, privileged)
        masked = [_mask(tmp / kind / WORKDIR, tracked) for kind in ("agent", "grader")]
        hidden = [
            hide_build_output(tmp / kind, image_rootfs) if image_rootfs else 0
            for kind in ("agent", "grader")
        ]
        if tracked:
            assert image_rootfs is not None  # only an image's rootfs has tracked files
            # Also in the agent's own repository, so `git status` stays clean.
            for git_dir in (tmp / "agent" / PRIVATE_GIT, tmp / "agent" / WORKDIR / ".git"):
                _exclude_artifacts(git_dir, image_rootfs)
        (tmp / STAMP).write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "ref": ref.to_data(),
                    "tree": tree,
                    "snapshot": snapshot,
                    "privileged": privileged,
                    "image": image_key,
                    "whiteouts": masked,
                    "hidden": hidden,
                }
            )
            + "\n"
        )
        install_built(tmp, base, "task layers")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def install_built(tmp: Path, base: Path, what: str) -> None:
    """Move a layer directory built in ``tmp`` (its stamp written last) to
    ``base``. Private too, should the root be opened: the service (group
    camg) checks the stamp; inside, modes stay what the sandbox uid needs.
    Another process that finished the same build first wins: theirs is kept."""
    if os.geteuid() == 0:
        os.lchown(tmp, 0, group_id(SERVICE_GROUP) or 0)
    os.chmod(tmp, 0o750)
    try:
        os.rename(tmp, base)
    except OSError as exc:
        if not (base / STAMP).is_file():
            raise ConfigError(f"cannot install {what} at {base}: {exc}") from None


def _build_agent(layer: Path, ref: TaskRef, privileged: bool) -> tuple[str, str]:
    work = layer / WORKDIR
    work.mkdir(parents=True)
    export_tree(ref.mirror, ref.tip, work)
    _run(["git", "init", "-q", "--template=", "-b", "main", str(work)])
    # Agents commit; without an identity every `git commit` fails.
    for key, value in (*_REPO_CONFIG, ("user.name", "agent"), ("user.email", "agent@sandbox")):
        git(work, "config", key, value)
    # -f: the tree may track files its own .gitignore matches.
    _run(["git", "-c", "safe.directory=*", "-C", str(work), "add", "-A", "-f"])
    _run(
        [
            "git",
            "-c",
            "safe.directory=*",
            "-C",
            str(work),
            "commit",
            "-q",
            "--no-verify",
            "-m",
            "Initial commit",
        ],
        env=_COMMIT_ENV,
    )
    tree = git(work, "rev-parse", "HEAD^{tree}").strip()
    expected = git(ref.mirror, "rev-parse", f"{ref.tip}^{{tree}}").strip()
    if tree != expected:
        raise ConfigError(f"{ref.branch}: snapshot tree {tree} differs from branch tree {expected}")
    snapshot = git(work, "rev-parse", "HEAD").strip()
    dot_git = work / ".git"
    for leftover in ("logs", "hooks", "description", "COMMIT_EDITMSG", "ORIG_HEAD"):
        path = dot_git / leftover
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    private = layer / PRIVATE_GIT
    private.parent.mkdir(parents=True)
    shutil.copytree(dot_git, private, symlinks=True)
    for path in (private.parent.parent.parent, private.parent.parent, private.parent):
        os.chmod(path, 0o755)
    os.chmod(private, 0o700)
    if privileged:
        _chown_tree(work, AGENT_UID, AGENT_GID)
        _opaque(dot_git)
    return tree, snapshot


def _build_grader(layer: Path, ref: TaskRef, privileged: bool) -> None:
    work = layer / WORKDIR
    layer.mkdir(parents=True)
    _run(
        [
            "git",
            "-c",
            "safe.directory=*",
            "clone",
            "-q",
            "--no-local",
            "--template=",
            "--single-branch",
            "--branch",
            ref.branch,
            ref.mirror,
            str(work),
        ]
    )
    for key, value in _REPO_CONFIG:
        git(work, "config", key, value)
    git(work, "checkout", "-q", "--detach", ref.tests)
    git(work, "remote", "remove", "origin")
    if privileged:
        _chown_tree(work, AGENT_UID, AGENT_GID)
        _opaque(work / ".git")
    # The grader's own pytest plugin, root-owned, outside anything the
    # agent's diff can reach (the diff only ever touches /testbed).
    guard = layer / GUARD_FILE
    guard.parent.mkdir(parents=True)
    shutil.copyfile(guard_source(), guard)
    for path in (guard, guard.parent, guard.parent.parent):
        os.chmod(path, 0o644 if path == guard else 0o755)


def export_tree(mirror: str, commit: str, dest: Path) -> None:
    """Write ``commit``'s tree under ``dest`` from raw blobs.

    Unlike ``git archive`` or a checkout, nothing of the repository's
    configuration or attributes is applied: no smudge/clean filter, no eol
    conversion, no export-subst. Paths are checked like an OCI layer's.
    """
    env = {**os.environ, **_SAFE_GIT_ENV}
    listing = subprocess.run(
        ["git", *_SAFE_GIT_ARGS, "-C", mirror, "ls-tree", "-r", "-z", "--full-tree", commit],
        capture_output=True,
        env=env,
        check=False,
    )
    if listing.returncode != 0:
        raise ConfigError(
            f"{mirror}@{commit}: cannot list the tree: "
            f"{listing.stderr.decode(errors='replace').strip()}"
        )
    entries = []
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        path = raw_path.decode("utf-8", "surrogateescape")
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts):
            raise ConfigError(f"{mirror}@{commit}: unsafe path {path!r} in the tree")
        if kind == "commit":
            continue  # a submodule: git archive leaves it empty too
        entries.append((mode, sha, parts))
    batch = subprocess.run(
        ["git", *_SAFE_GIT_ARGS, "-C", mirror, "cat-file", "--batch"],
        input=b"".join(sha.encode() + b"\n" for _, sha, _ in entries),
        capture_output=True,
        env=env,
        check=False,
    )
    if batch.returncode != 0:
        raise ConfigError(f"{mirror}@{commit}: cannot read blobs")
    data, offset = batch.stdout, 0
    for mode, _sha, parts in entries:
        header_end = data.index(b"\n", offset)
        size = int(data[offset:header_end].split()[2])
        body = data[header_end + 1 : header_end + 1 + size]
        offset = header_end + 1 + size + 1
        target = dest.joinpath(*parts)
        parent = target.parent
        parent.mkdir(parents=True, exist_ok=True)
        if parent.is_symlink() or not parent.resolve().is_relative_to(dest.resolve()):
            raise ConfigError(f"{mirror}@{commit}: {'/'.join(parts)} goes through a symlink")
        if mode == "120000":
            os.symlink(os.fsdecode(body), target)
        else:
            target.write_bytes(body)
            os.chmod(target, 0o755 if mode == "100755" else 0o644)


def _image_git(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """git on an image's own clone, as root, without its configuration.

    The image's .git/config can name an fsmonitor, hooks, filters or diff
    drivers; none of it is read: git gets a fresh empty repository of ours
    as its git dir and only the image's index file (GIT_INDEX_FILE), which
    can name files but run nothing.
    """
    dot_git = workspace / ".git"
    index = dot_git / "index"
    for path, want in ((dot_git, stat.S_ISDIR), (index, stat.S_ISREG)):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise ConfigError(f"the image's workspace {workspace} has no {path.name}") from None
        if not want(mode):
            raise ConfigError(
                f"the image's {path} is not a plain "
                f"{'directory' if want is stat.S_ISDIR else 'file'}"
            )
    with tempfile.TemporaryDirectory(prefix="camg-image-git.") as empty:
        subprocess.run(
            ["git", "init", "-q", "--bare", "--template=", empty],
            env={**os.environ, **_SAFE_GIT_ENV},
            check=True,
            capture_output=True,
        )
        env = {
            **os.environ,
            **_SAFE_GIT_ENV,
            "GIT_INDEX_FILE": str(index),
            "GIT_DIR": empty,
            "GIT_WORK_TREE": str(workspace),
        }
        return subprocess.run(
            ["git", *_SAFE_GIT_ARGS, "-c", "core.bare=false", *args],
            cwd=workspace,
            env=env,
            capture_output=True,
            check=False,
        )


def image_tracked(image_rootfs: str | os.PathLike) -> list[str]:
    """Files the image's own clone at /testbed tracks (none without a clone)."""
    workspace = Path(image_rootfs) / WORKDIR
    if not os.path.lexists(workspace / ".git"):
        return []
    out = _image_git(workspace, "ls-files", "-z")
    if out.returncode != 0:
        raise ConfigError(
            f"cannot list the image's workspace {workspace}: "
            f"{out.stderr.decode(errors='replace').strip()}"
        )
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _mask(work: Path, tracked: list[str]) -> int:
    """Whiteouts for image-tracked paths our tree lacks; returns how many.

    The highest missing ancestor is whited out, so a removed directory
    hides the image's whole directory with one entry.
    """
    count = 0
    for rel in tracked:
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            path = work.joinpath(*parts[:depth])
            if not os.path.lexists(path):
                os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))
                os.lchown(path, AGENT_UID, AGENT_GID)
                count += 1
                break
            if path.is_symlink() or not path.is_dir():
                break  # our file (or whiteout) already hides the image's entry
    return count


# Whatever running or building the clean tree left in the image's workspace:
# caches anywhere, bytecode beside sources, dist/ and build/lib*, build/bdist*
# (copies of the sources; build/'s other content, objects of compiled
# extensions, stays).
_CACHE_DIRS = frozenset(
    {
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".hypothesis",
        ".tox",
        ".nox",
        ".eggs",
    }
)
_COMPILED = (".pyc", ".pyo", ".egg")
_SITE_GLOBS = (
    "opt/*/lib/python3*/site-packages",
    "opt/*/envs/*/lib/python3*/site-packages",
    "usr/local/lib/python3*/site-packages",
    "usr/lib/python3*/site-packages",
    "usr/local/lib/python3*/dist-packages",
    "usr/lib/python3/dist-packages",
)
_NOT_PACKAGES = frozenset({"setup", "conftest", "noxfile", "tasks", "docs", "tests", "test"})


def hide_build_output(layer: Path, image_rootfs: str | os.PathLike) -> int:
    """Whiteouts in ``layer`` for the image's bytecode, caches, build output
    and installed copies of the project; returns how many.

    The image was built at the clean commit, so all of it holds the fixed
    code. A directory our tree also has is made opaque instead (our files
    stay, the image's go).
    """
    image = Path(image_rootfs)
    workspace = image / WORKDIR
    hide: list[Path] = []
    if workspace.is_dir() and not workspace.is_symlink():
        for dirpath, dirnames, filenames in os.walk(workspace):
            rel = Path(dirpath).relative_to(image)
            top = rel == Path(WORKDIR)
            if top:
                dirnames[:] = [d for d in dirnames if d != ".git"]
            out = {
                d
                for d in dirnames
                if d in _CACHE_DIRS
                or d.endswith(".egg")
                or (top and d == "dist")
                or (rel == Path(WORKDIR, "build") and d.startswith(("lib", "bdist")))
            }
            hide += [rel / name for name in sorted(out)]
            hide += [rel / name for name in sorted(filenames) if name.endswith(_COMPILED)]
            dirnames[:] = [d for d in dirnames if d not in out]
    hide += _installed_copies(layer / WORKDIR, image)
    return sum(_whiteout(layer, rel, image) for rel in hide)


def _installed_copies(work: Path, image: Path) -> list[Path]:
    """The project's top-level packages (and modules) as copies in the
    image's site-packages: a non-editable install of the clean tree."""
    packages, modules = set(), set()
    for base in (work, work / "src"):
        if not base.is_dir() or base.is_symlink():
            continue
        for entry in base.iterdir():
            if entry.name in _NOT_PACKAGES or entry.stem in _NOT_PACKAGES or entry.is_symlink():
                continue
            if entry.is_dir() and (entry / "__init__.py").is_file():
                packages.add(entry.name)
            elif entry.suffix == ".py" and entry.is_file():
                modules.add(entry.name)
    # A project's loose top-level modules count only when it has no package
    # (a single-module project): beside a package they are scripts and
    # helpers whose names a dependency may share.
    names = packages or modules
    copies = []
    for pattern in _SITE_GLOBS:
        for site in sorted(image.glob(pattern)):
            if site.is_symlink() or not site.is_dir():
                continue
            for name in sorted(names):
                copy = site / name
                if os.path.lexists(copy) and not copy.is_symlink():
                    copies.append(copy.relative_to(image))
    return copies


def _whiteout(layer: Path, rel: Path, image: Path) -> int:
    # Parents our layer lacks are made like the image's, so the merged view
    # keeps the image's owner and mode for them.
    parent = layer
    for part in rel.parts[:-1]:
        parent = parent / part
        if parent.is_symlink() or (os.path.lexists(parent) and not parent.is_dir()):
            return 0  # our entry (or a whiteout) already hides the image's
        if not parent.exists():
            st = os.lstat(image / parent.relative_to(layer))
            parent.mkdir()
            os.chmod(parent, stat.S_IMODE(st.st_mode))
            os.lchown(parent, st.st_uid, st.st_gid)
    target = layer / rel
    if os.path.lexists(target):
        if target.is_dir() and not target.is_symlink():
            _opaque(target)
            return 1
        return 0
    os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
    return 1


def _exclude_artifacts(private: Path, image_rootfs: str | os.PathLike) -> None:
    """Keep what the image built in its workspace out of the agent's diff.

    Those files show through the overlay and would otherwise be collected
    as new files, which the grader's sandbox (over the same image) already
    has: the whole diff would then fail to apply.
    """
    workspace = Path(image_rootfs) / WORKDIR
    out = _image_git(workspace, "ls-files", "--others", "--directory", "-z")
    if out.returncode != 0:
        raise ConfigError(
            f"cannot list the image's build artifacts in {workspace}: "
            f"{out.stderr.decode(errors='replace').strip()}"
        )
    entries = [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    info = private / "info"
    if not info.exists():
        info.mkdir()
        os.lchown(info, *_owner(private))
    with open(info / "exclude", "w", encoding="utf-8", errors="surrogateescape") as f:
        for entry in entries:
            f.write("/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", entry) + "\n")
    os.lchown(info / "exclude", *_owner(private))


def _owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def _opaque(path: Path) -> None:
    os.setxattr(path, "trusted.overlay.opaque", b"y")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    full_env = {**os.environ, **_SAFE_GIT_ENV, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, env=full_env, check=False)
    if proc.returncode != 0:
        raise ConfigError(
            f"{' '.join(cmd[:6])}... failed: {proc.stderr.decode(errors='replace').strip()}"
        )
