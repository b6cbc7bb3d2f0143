"""The sandbox's filesystem: overlay of lowers, uppers, archives in and out."""

from __future__ import annotations

import io
import os
import shutil
import tarfile

import pytest

from camg import errors


@pytest.fixture
def task_layer(lower_root):
    """A task layer like the Coding environment's: testbed/ owned by the agent."""
    layer = lower_root / f"task-{os.getpid()}"
    (layer / "testbed").mkdir(parents=True)
    (layer / "testbed" / "README").write_text("original\n")
    for p in (layer / "testbed", layer / "testbed" / "README"):
        os.chown(p, 2000, 2000)
    yield layer
    shutil.rmtree(layer)


def _tar(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_task_layer_is_writable_by_agent_via_copy_up(client, rootfs, task_layer, upper, helper):
    sid = client.create_sandbox([str(rootfs), str(task_layer)], memory_bytes=128 << 20,
                                cpu_quota=1.0, pids_max=64, upper=upper)
    try:
        r = client.exec(sid, "cat README && echo changed > README && echo new > added && cat README "
                        "&& ls /bin/bash && touch /etc/x", cwd="/testbed")
        assert r.output.splitlines()[:3] == ["original", "changed", "/bin/bash"]
        assert "Permission denied" in r.output and r.exit_code != 0
        assert (task_layer / "testbed" / "README").read_text() == "original\n"
        assert not (task_layer / "testbed" / "added").exists()
        uppers = sorted(os.listdir(helper.config["upper_root"]))
        # A disk upper is its own filesystem: the mount point and its image.
        assert len(uppers) == (2 if upper == "disk" else 0)
        if upper == "disk":
            assert uppers[1] == uppers[0] + ".img"
            assert os.path.ismount(os.path.join(helper.config["upper_root"], uppers[0]))
    finally:
        client.destroy(sid)
    assert os.listdir(helper.config["upper_root"]) == []


def test_disk_upper_is_bounded_by_upper_bytes(client, rootfs):
    """A disk upper is its own filesystem of upper_bytes: an agent filling it
    meets ENOSPC (bytes and inodes), not the host's disk (issue 11 escape
    battery). It wrote without bound before."""
    sid = client.create_sandbox([str(rootfs)], memory_bytes=128 << 20, cpu_quota=1.0,
                                pids_max=64, upper="disk", upper_bytes=32 << 20)
    try:
        r = client.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; df -k /tmp")
        assert "No space left on device" in r.output, r.output
        assert int(r.output.splitlines()[-1].split()[1]) < 32 * 1024, r.output
    finally:
        client.destroy(sid)


def test_archive_round_trip(client, sandbox):
    client.put_archive(sandbox, "/work/in", _tar({"a.txt": b"alpha", "sub/b.txt": b"beta"}))
    r = client.exec(sandbox, "cat /work/in/a.txt /work/in/sub/b.txt; stat -c %u /work/in/a.txt")
    assert r.output == "alphabeta0\n"
    data = client.get_archive(sandbox, "/work/in")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = sorted(tar.getnames())
        assert names == ["in", "in/a.txt", "in/sub", "in/sub/b.txt"]
        assert tar.extractfile("in/sub/b.txt").read() == b"beta"


def test_archive_as_agent_owns_files(client, sandbox):
    client.put_archive(sandbox, "/tmp/agent-files", _tar({"f": b"x"}), user="agent")
    assert client.exec(sandbox, "stat -c %u /tmp/agent-files/f").output == "2000\n"


def test_archive_symlinks_stay_inside(client, sandbox, helper):
    # A symlink pointing at the host's state dir resolves inside the sandbox.
    state = helper.config["state_dir"]
    client.put_archive(sandbox, "/x", _tar({}, {"escape": state}))
    client.exec(sandbox, f"mkdir -p {state}", user="root")
    client.put_archive(sandbox, "/x/escape", _tar({"planted": b"p"}))
    assert not os.path.exists(os.path.join(state, "planted"))
    assert client.exec(sandbox, f"cat {state}/planted").output == "p"
    # Reading through a link to /etc/shadow reads the sandbox's own file.
    client.exec(sandbox, "ln -s /etc/shadow /tmp/s", user="root")
    data = client.get_archive(sandbox, "/tmp/s")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getmember("s").issym()


def test_archive_errors(client, sandbox):
    with pytest.raises(errors.NotFound):
        client.get_archive(sandbox, "/does/not/exist")
    with pytest.raises(errors.BadRequest):
        client.get_archive(sandbox, "/etc/../root")
    with pytest.raises(errors.BadRequest):
        client.put_archive(sandbox, "relative/dir", _tar({"a": b"a"}))
    with pytest.raises(errors.BadRequest):
        client.put_archive(sandbox, "/tmp/bad", b"this is not a tar stream" * 100)


def test_lowers_outside_roots_or_through_symlinks_are_refused(client, rootfs, lower_root, tmp_path):
    link = lower_root / f"link-{os.getpid()}"
    link.symlink_to(rootfs)
    try:
        for bad in ("/etc", str(lower_root / ".." / "helper" / rootfs.name), str(link),
                    str(link / "usr"), "relative/path", str(rootfs) + ",upperdir=/tmp",
                    str(lower_root / "missing")):
            with pytest.raises((errors.BadRequest, errors.NotFound)):
                client.create_sandbox([bad], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
    finally:
        link.unlink()
