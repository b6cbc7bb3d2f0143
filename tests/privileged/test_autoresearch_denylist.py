"""The helper's deny-list of private roots (AutoResearch's answers).

A private root is never a lower the helper accepts: not by its own path,
not below it, not above it, not through a bind mount of it or of a
directory holding it; and the helper refuses to start when a configured
root overlaps one. Real helper, real bind mounts, leak-checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import conftest as pc
from camg import errors

pytestmark = [pytest.mark.privileged]


@pytest.fixture(scope="module")
def layout(rootfs):
    """base/lowers (a lower root) holding an ordinary lower; base/private
    (the private root, outside every lower root) holding answers."""
    base = Path(tempfile.mkdtemp(prefix="camg-ar-deny-"))
    base.chmod(0o711)
    lowers = base / "lowers"
    (lowers / "ok").mkdir(parents=True)
    (lowers / "ok" / "public.txt").write_text("public\n")
    private = base / "private" / "answers"
    (private / "task").mkdir(parents=True)
    (private / "task" / "answers.csv").write_text("secret\n")
    os.chmod(base / "private", 0o700)
    yield {"base": base, "lowers": lowers, "private": private, "rootfs": rootfs}
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def deny_helper(layout, rootfs):
    base = layout["base"] / "helper"
    cfg = pc.helper_config(base, layout["lowers"], rootfs,
                           lower_roots=[str(layout["lowers"]), str(pc.CACHE / "helper")],
                           private_roots=[str(layout["private"])])
    helper = pc.start_helper(base, cfg)
    pc.state_root(base / "state" / "ledger")
    yield helper
    pc.stop_helper(helper)


@pytest.fixture
def bind(layout):
    made: list[Path] = []

    def mount(source: Path, name: str) -> Path:
        target = layout["lowers"] / name
        target.mkdir()
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
        made.append(target)
        return target
    yield mount
    for target in reversed(made):
        subprocess.run(["umount", str(target)], check=True)
        target.rmdir()


def _create(client, lower: Path, rootfs: Path) -> str:
    return client.create_sandbox([str(rootfs), str(lower)], memory_bytes=64 << 20,
                                 cpu_quota=0.5, pids_max=32)


def test_ordinary_lower_admitted_private_invisible(deny_helper, layout, rootfs):
    with deny_helper.client(owner=f"t{os.getpid()}") as client:
        sid = _create(client, layout["lowers"] / "ok", rootfs)
        try:
            r = client.exec(sid, f"cat /public.txt; ls {layout['private']} 2>&1; true")
            assert "public" in r.output
            assert "No such file" in r.output
        finally:
            client.destroy(sid)


@pytest.mark.parametrize("which", ["root", "inside", "parent"])
def test_private_paths_refused(deny_helper, layout, rootfs, which):
    target = {"root": layout["private"], "inside": layout["private"] / "task",
              "parent": layout["private"].parent}[which]
    with deny_helper.client(owner=f"t{os.getpid()}") as client:
        with pytest.raises(errors.BadRequest) as info:
            _create(client, target, rootfs)
        assert info.value.details["helper_error"] == "path_escape"
        assert client.list_sandboxes() == []


@pytest.mark.parametrize("source", ["private", "inside", "parent"])
def test_bind_mounts_of_private_refused(deny_helper, layout, rootfs, bind, source):
    """Below a lower root by path, but the private root by identity."""
    src = {"private": layout["private"], "inside": layout["private"] / "task",
           "parent": layout["private"].parent}[source]
    mounted = bind(src, f"bind-{source}")
    with deny_helper.client(owner=f"t{os.getpid()}") as client:
        with pytest.raises(errors.BadRequest) as info:
            _create(client, mounted, rootfs)
        assert info.value.details["helper_error"] == "path_escape"
        if source == "private":
            with pytest.raises(errors.BadRequest):
                _create(client, mounted / "task", rootfs)


def _start_fails(layout, rootfs, tmp: Path, **extra) -> str:
    cfg = pc.helper_config(tmp, layout["lowers"], rootfs,
                           private_roots=[str(layout["private"])], **extra)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "helper.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.run([sys.executable, "-m", "helper", "--config", str(tmp / "helper.json"),
                           "--probe"], cwd=pc.ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    return proc.stderr


def test_start_refused_when_lower_root_holds_private(layout, rootfs, tmp_path):
    err = _start_fails(layout, rootfs, tmp_path / "h1",
                       lower_roots=[str(layout["base"] / "private")])
    assert "private_roots" in err and "overlaps" in err


def test_start_refused_when_upper_root_is_private(layout, rootfs, tmp_path):
    err = _start_fails(layout, rootfs, tmp_path / "h2", upper_root=str(layout["private"] / "u"))
    assert "private_roots" in err


def test_start_refused_when_lower_root_is_a_bind_of_private(layout, rootfs, tmp_path, bind):
    mounted = bind(layout["private"].parent, "bound-parent")
    err = _start_fails(layout, rootfs, tmp_path / "h3", lower_roots=[str(mounted)])
    assert "private root" in err
