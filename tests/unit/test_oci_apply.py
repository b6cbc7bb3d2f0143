"""The safe layer applier against hand-made layers, benign and malicious."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from camg.errors import DatasetError
from tools.oci.apply import ApplyOptions, apply_layer

ROOT = os.geteuid() == 0


def entry(name, kind="file", data=b"", mode=None, linkname="", uid=0, gid=0):
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE,
                 "fifo": tarfile.FIFOTYPE}[kind]
    info.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    info.linkname = linkname
    info.uid, info.gid = uid, gid
    info.mtime = 1_700_000_000
    if kind == "file":
        info.size = len(data)
    return info, data


def layer(*entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def apply(root: Path, *entries, options=None, name="test/image", digest="sha256:" + "ab" * 32):
    options = options or ApplyOptions(chown=ROOT)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=io.BytesIO(layer(*entries)), mode="r|") as tar:
            return apply_layer(fd, tar, image=name, layer=digest, options=options)
    finally:
        os.close(fd)


@pytest.fixture
def world(tmp_path):
    """A root to apply into, next to an 'outside' the layers must never touch."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("keep me")
    return root, outside


def tree(path: Path) -> dict[str, str]:
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(path))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = "-> " + os.readlink(p)
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = "dir"
        else:
            out[rel] = p.read_text(errors="replace")
    return out


def assert_rejected(root, outside, *entries, match):
    before = tree(outside)
    with pytest.raises(DatasetError, match=match) as info:
        apply(root, *entries)
    assert tree(outside) == before
    assert info.value.details["image"] == "test/image"
    assert info.value.details["layer"] == "sha256:" + "ab" * 32
    return info.value


def test_regular_tree_modes_and_links(world):
    root, _ = world
    stats = apply(root,
                  entry("etc/", "dir"),
                  entry("etc/hostname", data=b"box\n", mode=0o640),
                  entry("usr/bin/tool", data=b"#!/bin/sh\n", mode=0o755),
                  entry("bin", "symlink", linkname="usr/bin"),
                  entry("etc/alt", "symlink", linkname="/usr/bin/tool"),
                  entry("usr/bin/tool2", "hardlink", linkname="usr/bin/tool"))
    assert (root / "etc/hostname").read_text() == "box\n"
    assert stat.S_IMODE((root / "etc/hostname").stat().st_mode) == 0o640
    assert os.readlink(root / "bin") == "usr/bin"
    assert os.readlink(root / "etc/alt") == "/usr/bin/tool"
    assert (root / "usr/bin/tool2").stat().st_ino == (root / "usr/bin/tool").stat().st_ino
    assert (stats.files, stats.symlinks, stats.hardlinks) == (2, 2, 1)
    assert (root / "etc/hostname").stat().st_mtime == 1_700_000_000


def test_dot_slash_names_and_root_entry_are_accepted(world):
    root, _ = world
    apply(root, entry("./", "dir", mode=0o777), entry("./a/./b", data=b"x"))
    assert (root / "a/b").read_text() == "x"
    assert stat.S_IMODE(root.stat().st_mode) != 0o777


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "a/../b"])
def test_dotdot_paths_are_rejected(world, name):
    root, outside = world
    assert_rejected(root, outside, entry(name, data=b"x"), match="'..' component")
    assert not (root.parent / "escape").exists()


def test_absolute_paths_are_rejected(world):
    root, outside = world
    assert_rejected(root, outside, entry(str(outside / "secret"), data=b"pwned"), match="absolute path")


def test_absolute_symlink_then_write_through_is_rejected(world):
    root, outside = world
    assert_rejected(root, outside,
                    entry("evil", "symlink", linkname=str(outside)),
                    entry("evil/secret", data=b"pwned"), match="parent 'evil' is a symlink")


def test_relative_symlink_escape_is_rejected(world):
    root, outside = world
    assert_rejected(root, outside, entry("a/evil", "symlink", linkname="../../outside"),
                    match="leaves the root")


def test_in_root_symlink_is_never_written_through(world):
    """A symlink that an earlier layer placed must not redirect a later layer."""
    root, outside = world
    apply(root, entry("lib", "symlink", linkname="/"))
    assert_rejected(root, outside, entry("lib/escape", data=b"x"), match="is a symlink")


def test_file_replaces_a_symlink_instead_of_following_it(world):
    root, outside = world
    apply(root, entry("target", "symlink", linkname=str(outside / "secret")))
    apply(root, entry("target", data=b"replaced"))
    assert not (root / "target").is_symlink()
    assert (root / "target").read_text() == "replaced"
    assert (outside / "secret").read_text() == "keep me"


@pytest.mark.parametrize("linkname,match", [
    ("../outside/secret", "'..' component"),
    ("/etc/passwd", "absolute path"),
    ("missing", "does not exist"),
])
def test_hardlink_escapes_are_rejected(world, linkname, match):
    root, outside = world
    assert_rejected(root, outside, entry("stolen", "hardlink", linkname=linkname), match=match)
    assert not (root / "stolen").exists()


def test_hardlink_through_a_symlinked_directory_is_rejected(world):
    root, outside = world
    apply(root, entry("out", "symlink", linkname=str(outside)))
    assert_rejected(root, outside, entry("stolen", "hardlink", linkname="out/secret"),
                    match="is a symlink")
    assert not (root / "stolen").exists()


def test_hardlink_to_a_symlink_links_the_symlink_itself(world):
    root, outside = world
    apply(root, entry("link", "symlink", linkname=str(outside / "secret")),
          entry("link2", "hardlink", linkname="link"))
    assert os.readlink(root / "link2") == str(outside / "secret")


@pytest.mark.parametrize("name,match", [
    ("../.wh.outside", "'..' component"),
    (".wh...", "whiteout names '..'"),
    (".wh..", "whiteout names '.'"),
    ("evil/.wh.secret", "is a symlink"),
    ("evil/.wh..wh..opq", "is a symlink"),
])
def test_whiteouts_aimed_outside_are_rejected(world, name, match):
    root, outside = world
    apply(root, entry("evil", "symlink", linkname=str(outside)))
    assert_rejected(root, outside, entry(name), match=match)
    assert (outside / "secret").read_text() == "keep me"


def test_whiteouts_and_opaque_directories(world):
    root, _ = world
    apply(root, entry("a/old", data=b"1"), entry("a/sub/deep", data=b"2"), entry("b/x", data=b"3"),
          entry("c", data=b"4"))
    stats = apply(root, entry("a/new", data=b"5"), entry("a/.wh..wh..opq"),
                  entry("b/.wh.x"), entry(".wh.c"), entry(".wh.never-existed"),
                  entry("gone/.wh.nothing"))
    assert tree(root) == {"a": "dir", "a/new": "5", "b": "dir"}
    assert stats.whiteouts == 5


def test_device_nodes_and_fifos_are_skipped(world):
    root, _ = world
    stats = apply(root, entry("dev/null", "chr"), entry("dev/sda", "blk"), entry("dev/fifo", "fifo"),
                  entry("dev/ok", data=b"x"))
    assert sorted(p.name for p in (root / "dev").iterdir()) == ["ok"]
    assert stats.skipped_devices == 3


@pytest.mark.skipif(not ROOT, reason="setuid bits survive only on root-owned files")
@pytest.mark.parametrize("policy,expected", [("keep", 0o4755), ("strip", 0o755)])
def test_setuid_policy(world, policy, expected):
    root, _ = world
    apply(root, entry("usr/bin/sudo", data=b"x", mode=0o4755),
          entry("usr/bin/wall", data=b"x", mode=0o2755, gid=5),
          entry("var/mail", "dir", mode=0o2775, gid=8),
          options=ApplyOptions(setuid=policy, chown=True))
    assert stat.S_IMODE((root / "usr/bin/sudo").stat().st_mode) == expected
    assert stat.S_IMODE((root / "usr/bin/wall").stat().st_mode) == expected & ~0o4000 | (
        0o2000 if policy == "keep" else 0)
    # setgid directories are harmless and kept under both policies.
    assert stat.S_IMODE((root / "var/mail").stat().st_mode) == 0o2775


def test_setuid_strip_without_root(world):
    root, _ = world
    apply(root, entry("su", data=b"x", mode=0o4755), options=ApplyOptions(setuid="strip", chown=False))
    assert stat.S_IMODE((root / "su").stat().st_mode) == 0o755


@pytest.mark.skipif(not ROOT, reason="needs root to chown")
def test_ownership_comes_from_numeric_headers(world):
    root, _ = world
    apply(root, entry("home/u", "dir", uid=1234, gid=4321), entry("home/u/f", data=b"x", uid=1234, gid=99),
          entry("home/u/l", "symlink", linkname="f", uid=1234, gid=1234))
    assert ((root / "home/u").stat().st_uid, (root / "home/u").stat().st_gid) == (1234, 4321)
    assert (root / "home/u/f").stat().st_gid == 99
    assert (root / "home/u/l").lstat().st_uid == 1234
    assert (root / "home").stat().st_uid == 0  # implicit parents belong to root


def test_replacements_between_kinds(world):
    root, _ = world
    apply(root, entry("x/inner", data=b"1"), entry("y", data=b"2"))
    apply(root, entry("x", data=b"now a file"), entry("y", "dir"))
    assert (root / "x").read_text() == "now a file"
    assert (root / "y").is_dir()


def test_entry_inside_a_file_is_rejected(world):
    root, outside = world
    apply(root, entry("f", data=b"x"))
    assert_rejected(root, outside, entry("f/child", data=b"y"), match="not a directory")


def test_whiteout_name_as_directory_is_rejected(world):
    root, outside = world
    assert_rejected(root, outside, entry(".wh.x/y", data=b"z"), match="whiteout name used as a directory")


def test_name_the_kernel_refuses_is_a_rejection(world):
    root, outside = world
    assert_rejected(root, outside, entry("a/" + "x" * 300, data=b"1"), match="File name too long")


def test_unusable_header_values_are_rejections(world):
    root, outside = world
    info, _ = entry("nul-link", "symlink")
    info.pax_headers = {"linkpath": "a\0b"}
    info.linkname = "a\0b"
    assert_rejected(root, outside, (info, b""), match="unusable header value")
