"""camg audit (camg/host_audit.py) on a temporary installation: the private
paths come from its configs, a world-readable grader file is named, a
private tree passes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from camg import host_audit, status
from camg.config.host_private import private_dir


@pytest.fixture
def base():
    # Not under pytest's tmp_path: its 0700 directories would close every
    # tree to others and hide what the audit is to find.
    path = Path(tempfile.mkdtemp(prefix="camg-audit.", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def install(base: Path, *, layers_mode: int) -> Path:
    """etc/ of a one-environment deployment, its state root and data."""
    etc, state, data = base / "etc", base / "state", base / "data" / "coding"
    (etc / "prepared").mkdir(parents=True)
    for d in (state, data):
        private_dir(d)
    layers = base / "task-layers" / "coding"
    grader = layers / "task-1" / "grader" / "testbed"
    grader.mkdir(parents=True)
    (grader / "test_fix.py").write_text("def test_fix(): ...\n")
    for d in (layers, *layers.parents):
        if d == base:
            break
        os.chmod(d, 0o755)
    os.chmod(layers, layers_mode)
    os.chmod(grader / "test_fix.py", 0o644)
    (data / "manifest.json").write_text("{}")
    (etc / "deployment.json").write_text(json.dumps({"state_root": str(state)}))
    (etc / "prepared" / "coding.json").write_text(json.dumps({
        "environment": "coding", "state_dir": str(state / "coding"),
        "manifest": {"path": str(data / "manifest.json"), "sha256": "sha256:0"},
        "settings": {"layers_root": str(layers), "mirrors_root": str(data / "mirrors"),
                     "images": str(data / "images.json")},
        "outcome_key": {"path": str(state / "signing" / "outcomes.key")}}))
    (etc / "prepared" / "routes.json").write_text(json.dumps({"routes": {}}))
    (etc / "helper.json").write_text(json.dumps({"private_roots": [str(base / "grader")]}))
    return etc


def test_paths_come_from_the_configs(base):
    etc = install(base, layers_mode=0o750)
    paths = host_audit.private_paths(etc)
    assert paths[str(base / "state")] == "state root"
    assert paths[str(base / "state" / "coding")] == "coding: state directory"
    assert paths[str(base / "data" / "coding")].startswith("coding: prepared data")
    assert paths[str(base / "task-layers" / "coding")] == "coding: layers_root"
    assert paths[str(base / "data" / "coding" / "mirrors")] == "coding: mirrors_root"
    assert paths[str(base / "state" / "signing" / "outcomes.key")] == "outcome signing key"
    assert paths[str(base / "grader")] == "helper private root"
    # A file setting (images) is no tree of data; routes.json no environment.
    assert str(base / "data" / "coding" / "images.json") not in paths


def test_a_world_readable_grader_file_is_named(base, capsys):
    # The layers root lets others pass but not list: the file is reachable.
    etc = install(base, layers_mode=0o711)
    assert host_audit.main(["--etc", str(etc)]) == 1
    out = capsys.readouterr().out
    grader_file = base / "task-layers/coding/task-1/grader/testbed/test_fix.py"
    assert f"{grader_file} (root:root 0644) is world-readable" in out
    # The directories above it are passable only by others, not readable:
    # listed, but named only as passable parents of what is found.
    row = next(l for l in out.splitlines() if l.startswith(str(base / "task-layers/coding ")))
    assert "0711" in row and "finding(s)" in row
    for name in ("state ", "data/coding "):
        line = next(l for l in out.splitlines() if l.startswith(str(base / name)))
        assert "private" in line


def test_a_private_layers_root_passes(base, capsys):
    # The same world-readable file, but the root closes the tree: the
    # sandbox uid keeps reading it through the overlay the helper mounts.
    etc = install(base, layers_mode=0o750)
    assert host_audit.main(["--etc", str(etc)]) == 0
    out = capsys.readouterr().out
    assert "no world-readable or world-writable one" in out
    assert "absent" in out      # the state directory before the service's first start


def test_world_writable_and_extra_paths(base, capsys):
    etc = install(base, layers_mode=0o750)
    cache = base / "cache"
    (cache / "autoresearch").mkdir(parents=True)
    os.chmod(cache, 0o755)
    os.chmod(cache / "autoresearch", 0o777)
    answers = cache / "autoresearch" / "answers.csv"
    answers.write_text("id,label\n")
    os.chmod(answers, 0o600)
    assert status.cli(["audit", "--etc", str(etc), "--path", str(cache), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == [
        f"{cache} (root:root 0755) is world-readable",
        f"{cache / 'autoresearch'} (root:root 0777) is world-readable and writable"]
    row = next(p for p in report["paths"] if p["path"] == str(cache))
    assert row["what"] == "named on the command line" and row["mode"] == "0755"


def test_private_dir_is_made_closed(base):
    made = private_dir(base / "a" / "b")
    st = made.stat()
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_uid == 0
    os.chmod(made, 0o755)
    assert stat.S_IMODE(private_dir(made).stat().st_mode) == 0o750


def test_a_missing_deployment_is_a_usage_error(base, capsys):
    assert host_audit.main(["--etc", str(base / "nothing")]) == 2
    assert "deployment" in capsys.readouterr().err


def test_quiet_prints_findings_only(base, capsys):
    etc = install(base, layers_mode=0o711)
    assert host_audit.main(["--etc", str(etc), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("findings (") and "PATH" not in out
    os.chmod(base / "task-layers" / "coding", 0o750)
    assert host_audit.main(["--etc", str(etc), "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("camg audit: 8 private paths, no world-readable")
