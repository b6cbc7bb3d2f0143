"""A sandbox's /dev/shm bound (issue 25): Ceilings.shm derives its size and
nr_inodes from the sandbox's memory, the two ceilings are validated with
the others, and the init (sbxinit.c) refuses a 0, which tmpfs reads as
"unlimited", before it joins or mounts anything. That a fill meets ENOSPC
inside a real sandbox is tests/privileged/test_sandbox_shm.py's."""

from __future__ import annotations

import json
import os
import socket

import pytest

from helper import initbin
from helper.config import Ceilings, ConfigError, HelperConfig, load


def test_size_is_the_ceiling_or_half_the_memory():
    c = Ceilings()
    assert (c.shm_bytes, c.shm_inodes) == (64 << 20, 4096)
    assert c.shm(256 << 20) == (64 << 20, 4096)
    assert c.shm(64 << 20) == (32 << 20, 4096)
    assert c.shm(4 << 20) == (2 << 20, 4096)  # the smallest memory_bytes a spec may ask
    assert Ceilings(shm_bytes=1 << 20, shm_inodes=100).shm(8 << 30) == (1 << 20, 100)
    for memory in (4 << 20, 256 << 20, 8 << 30):
        size, inodes = c.shm(memory)
        assert 0 < size <= memory // 2 and inodes > 0


def test_shm_ceilings_are_validated(tmp_path):
    for bad in (dict(shm_bytes=0), dict(shm_inodes=0), dict(shm_inodes=-1)):
        with pytest.raises(ConfigError, match="ceilings"):
            HelperConfig(ceilings=Ceilings(**bad))
    p = tmp_path / "helper.json"
    p.write_text(json.dumps({"ceilings": {"shm_bytes": 8 << 20, "shm_inodes": 512}}))
    assert load(str(p)).ceilings.shm(1 << 30) == (8 << 20, 512)
    p.write_text(json.dumps({"ceilings": {"shm_inodes": "512"}}))
    with pytest.raises(ConfigError):
        load(str(p))


def _init_says(binary: str, shm: list[str]) -> tuple[int, bytes]:
    """Run the init unprivileged with a control socket on fd 3: what it
    reports before anything needs root."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.posix_spawn(binary, [binary, "h", "/nonexistent", "/l", "tmpfs", str(1 << 20),
                                      *shm, "/nonexistent/cgroup.procs"], {},
                             file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), 3)])
        theirs.close()
        _, status = os.waitpid(pid, 0)
        ours.settimeout(10)
        return os.waitstatus_to_exitcode(status), ours.recv(4096)
    finally:
        ours.close()
        theirs.close()


def test_init_refuses_an_unbounded_shm(tmp_path):
    if not any(os.access(os.path.join(d, "cc"), os.X_OK) for d in os.environ["PATH"].split(":")):
        pytest.fail("a C compiler (build-essential) is required to build the sandbox init")
    binary = initbin.ensure("", str(tmp_path))
    assert _init_says(binary, ["0", "4096"]) == (1, b"Fshm_bytes 0: Invalid argument")
    assert _init_says(binary, [str(64 << 20), "0"]) == (1, b"Fshm_inodes 0: Invalid argument")
    assert _init_says(binary, [str(64 << 20), "4k"]) == (1, b"Fshm_inodes 4k: Invalid argument")
    # Valid bounds get as far as joining the cgroups (absent here).
    code, msg = _init_says(binary, [str(64 << 20), "4096"])
    assert code == 1 and msg.startswith(b"Fjoin /nonexistent/cgroup.procs"), msg
