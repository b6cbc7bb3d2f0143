"""Git run as root on an image's /testbed (or a mirror) runs nothing the
repository's own configuration names: no fsmonitor, hook, filter or diff
driver (issue 11, defect 5). Each hostile setting is first shown to fire
under a plain git command, so the test proves the guard, not a dud."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from environments.coding import prepare_layers


def _hostile_repo(root: Path, marker: Path) -> Path:
    ws = root / "testbed"
    ws.mkdir(parents=True)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x",
           "GIT_COMMITTER_EMAIL": "x@x"}
    run = lambda *a: subprocess.run(["git", "-C", str(ws), *a], env=env, check=True,
                                    capture_output=True)
    run("init", "-q", "-b", "main")
    (ws / "a.py").write_text("x = 1\n")
    (ws / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    run("add", "-A")
    run("commit", "-q", "-m", "base")
    (ws / "built.so").write_bytes(b"\x7fELF")          # an untracked build artifact
    touch = f"sh -c 'echo $0 >> {marker}'"
    for key, value in (("core.fsmonitor", f"{touch} fsmonitor"),
                       ("filter.evil.clean", f"{touch} clean"),
                       ("filter.evil.smudge", f"{touch} smudge"),
                       ("filter.evil.process", f"{touch} process"),
                       ("diff.evil.textconv", f"{touch} textconv"),
                       ("diff.external", f"{touch} external"),
                       ("core.pager", f"{touch} pager")):
        run("config", key, value)
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("post-checkout", "pre-commit", "post-index-change", "reference-transaction",
                 "fsmonitor-watchman"):
        (hooks / hook).write_text(f"#!/bin/sh\necho hook-{hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    return ws


def test_hostile_config_is_live_under_plain_git(tmp_path):
    marker = tmp_path / "fired"
    ws = _hostile_repo(tmp_path / "image", marker)
    (ws / "a.py").write_text("x = 2\n")
    subprocess.run(["git", "-C", str(ws), "-c", "safe.directory=*", "status"],
                   capture_output=True, check=False)
    assert marker.exists(), "the canary config did not fire under plain git: test is a dud"


def test_image_workspace_listing_runs_nothing(tmp_path):
    marker = tmp_path / "fired"
    ws = _hostile_repo(tmp_path / "image", marker)
    tracked = prepare_layers.image_tracked(tmp_path / "image")
    assert sorted(tracked) == [".gitattributes", "a.py"]
    private = tmp_path / "private-git"
    private.mkdir()
    prepare_layers._exclude_artifacts(private, tmp_path / "image")
    assert "/built.so" in (private / "info" / "exclude").read_text()
    assert not marker.exists(), marker.read_text()


def test_tree_export_applies_no_filter(tmp_path):
    marker = tmp_path / "fired"
    ws = _hostile_repo(tmp_path / "mirror", marker)
    head = subprocess.run(["git", "-C", str(ws), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    out = tmp_path / "out"
    out.mkdir()
    prepare_layers.export_tree(str(ws), head, out)
    assert (out / "a.py").read_text() == "x = 1\n"
    assert not marker.exists(), marker.read_text()


def test_image_git_dir_that_is_a_symlink_is_refused(tmp_path):
    ws = tmp_path / "image" / "testbed"
    ws.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", ws / ".git")
    with pytest.raises(prepare_layers.ConfigError, match="not a plain directory"):
        prepare_layers.image_tracked(tmp_path / "image")
