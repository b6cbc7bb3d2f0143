"""A sandbox's /dev/shm is bounded in bytes and inodes (issue 25): filling it
meets ENOSPC inside the bound (Ceilings.shm: 64 MiB, at most half the
sandbox's memory; 4096 inodes), never the memory cgroup's OOM killer or the
host's inodes. It had neither bound before (a tmpfs's default nr_inodes is
half the host's RAM pages). /dev itself, writable by the sandbox's root, is
bounded in inodes as it was in bytes. The helper's own start-up probe
(``echo x > /dev/shm/probe``) passes: the session helper waits for it."""

from __future__ import annotations

import os

import pytest

from helper import cgroups

SPEC = dict(cpu_quota=1.0, pids_max=64)


def _oom_kills(helper, sid: str) -> int:
    path = os.path.join(helper.config["cgroup_parents"]["memory"], cgroups.cgroup_name(sid),
                        "memory.oom_control")
    with open(path) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("oom_kill "))


@pytest.mark.parametrize("memory_mib, shm_mib", [(256, 64), (64, 32)])
def test_dev_shm_bytes_meet_enospc_before_the_oom_killer(client, rootfs, helper, memory_mib, shm_mib):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=memory_mib << 20, **SPEC)
    try:
        r = client.exec(sid, "df -k --output=size /dev/shm | tail -1")
        assert int(r.output) == shm_mib * 1024, r.output
        r = client.exec(sid, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=400 2>&1; "
                        "echo size=$(stat -c %s /dev/shm/fill); rm -f /dev/shm/fill; echo alive",
                        user="agent", timeout=120)
        assert "No space left on device" in r.output, r.output
        assert r.output.endswith("alive\n"), r.output
        assert int(r.output.split("size=")[1].split()[0]) <= shm_mib << 20, r.output
        assert _oom_kills(helper, sid) == 0
    finally:
        client.destroy(sid)


def test_dev_shm_inodes_meet_enospc(client, rootfs, helper):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=256 << 20, **SPEC)
    try:
        assert int(client.exec(sid, "df --output=itotal /dev/shm | tail -1").output) == 4096
        # Empty files cost no blocks, only inodes; 100000 is far past the bound.
        r = client.exec(sid, "cd /dev/shm && i=0; while [ $i -lt 100000 ]; do "
                        ": > f$i || break; i=$((i+1)); done; echo made=$i; "
                        "rm -f f*; echo alive", user="agent", timeout=300)
        made = int(r.output.split("made=")[1].split()[0])
        assert 4000 < made < 4096, r.output  # the root directory is one of the 4096
        assert "No space left on device" in r.output and r.output.endswith("alive\n"), r.output
        assert _oom_kills(helper, sid) == 0
    finally:
        client.destroy(sid)


def test_dev_inodes_are_bounded_for_root(client, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=128 << 20, **SPEC)
    try:
        r = client.exec(sid, "mkdir /dev/d && cd /dev/d && i=0; while [ $i -lt 100000 ]; do "
                        ": > f$i || break; i=$((i+1)); done; echo made=$i; "
                        "cd / && rm -rf /dev/d", user="root", timeout=300)
        made = int(r.output.split("made=")[1].split()[0])
        assert 0 < made < 256, r.output
        assert "No space left on device" in r.output, r.output
        # The devices are unharmed.
        assert client.exec(sid, "echo x > /dev/null && head -c 4 /dev/zero | wc -c").output == "4\n"
    finally:
        client.destroy(sid)
