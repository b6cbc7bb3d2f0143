"""Exec semantics of a helper sandbox: identity, env, I/O, truncation, timeouts."""

from __future__ import annotations

import os
import time

import pytest

from camg import errors


def _live(client, sandbox, name: str) -> list[str]:
    """Non-zombie processes called ``name``; SIGKILL is asynchronous, so wait a little."""
    script = ("for f in /proc/[0-9]*/status; do grep -E '^(Name|State):' $f 2>/dev/null"
              " | tr '\\n' ' '; echo; done")
    deadline = time.monotonic() + 3
    while True:
        out = client.exec(sandbox, script).output
        live = [l for l in out.splitlines() if l.split()[1:2] == [name] and "(zombie)" not in l]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


def test_agent_identity_and_environment(client, sandbox):
    r = client.exec(sandbox, 'id; echo "$HOME $USER $LOGNAME"; pwd; echo "$FOO"', cwd="/tmp",
                    env={"FOO": "bar baz"})
    assert r.exit_code == 0 and not r.timed_out and not r.truncated
    lines = r.output.splitlines()
    assert lines[0] == "uid=2000 gid=2000 groups=2000"
    assert lines[1] == "/home/agent agent agent"
    assert lines[2:] == ["/tmp", "bar baz"]


def test_agent_can_use_dev_nodes_and_shm(client, sandbox):
    r = client.exec(sandbox, "echo x > /dev/null && head -c 4 /dev/zero | wc -c && echo s > /dev/shm/s "
                    "&& cat /dev/shm/s && stat -c %a /dev/null /dev/urandom /dev/shm /dev/pts/ptmx")
    assert r.exit_code == 0, r.output
    assert r.output.split() == ["4", "s", "666", "666", "1777", "666"]


def test_root_user_is_sandbox_root_without_host_powers(client, sandbox):
    r = client.exec(sandbox, "id -u; grep NoNewPrivs /proc/self/status; mount -t tmpfs x /mnt",
                    user="root")
    assert r.output.splitlines()[:2] == ["0", "NoNewPrivs:\t1"]
    assert r.exit_code != 0


def test_stdin_and_interleaved_output(client, sandbox):
    r = client.exec(sandbox, "cat; echo out; echo err >&2; echo out2", stdin=b"hello\n")
    assert r.output == "hello\nout\nerr\nout2\n"


def test_commands_get_default_signals_and_threads(client, sandbox):
    r = client.exec(sandbox, "yes | head -n 2; seq 1 200000 | sort --parallel=4 -S 8M -n | tail -n 1")
    assert r.output == "y\ny\n200000\n" and r.exit_code == 0


def test_namespaces_and_keyrings_are_filtered(client, sandbox):
    for user in ("agent", "root"):
        r = client.exec(sandbox, "unshare -Ur true; echo $?; grep Seccomp: /proc/self/status", user=user)
        lines = r.output.splitlines()
        assert lines[-2:] == ["1", "Seccomp:\t2"], r.output


def test_exit_codes(client, sandbox):
    assert client.exec(sandbox, "exit 3").exit_code == 3
    assert client.exec(sandbox, "kill -TERM $$").exit_code == 128 + 15
    r = client.exec(sandbox, "echo x", cwd="/nonexistent")
    assert r.exit_code == 1 and "cannot change directory" in r.output


def test_output_keeps_final_bytes_with_marker(client, sandbox):
    r = client.exec(sandbox, "seq 1 20000")
    assert r.truncated
    first, rest = r.output.split("\n", 1)
    assert first == "[output truncated to final 12000 bytes]"
    assert len(rest.encode()) == 12000 and rest.endswith("19999\n20000\n")
    small = client.exec(sandbox, "seq 1 20000", output_limit=10)
    assert small.output == "[output truncated to final 10 bytes]\n999\n20000\n"


def test_timeout_kills_disowned_tree(client, sandbox):
    r = client.exec(sandbox, "echo started; setsid sleep 600 & disown; (sleep 700 &); sleep 800",
                    timeout=1)
    assert r.timed_out and r.exit_code == 124
    assert r.output == "started\n\n[command timed out]"
    assert 1 <= r.duration < 5
    assert _live(client, sandbox, "sleep") == []


def test_background_process_group_is_killed_after_exit(client, sandbox):
    # Like an agent shell: the command's process group ends with it.
    client.exec(sandbox, "sleep 300 & echo bg")
    assert _live(client, sandbox, "sleep") == []


def test_memory_and_pids_limits_apply(client, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=32 << 20, cpu_quota=0.5, pids_max=16)
    try:
        assert client.exec(sid, "a=x; while :; do a=$a$a; done", timeout=20).exit_code == 137
        r = client.exec(sid, "for i in $(seq 40); do sleep 5 & done; wait", timeout=3)
        assert "Resource temporarily unavailable" in r.output
        assert client.exec(sid, "echo ok").output == "ok\n"
    finally:
        client.destroy(sid)


def test_killed_init_surfaces_as_sandbox_died(client, helper, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32)
    before = helper.sandbox_inits()
    assert client.exec(sid, "echo hi").output == "hi\n"
    (init,) = [p for p in helper.sandbox_inits() if p in before]
    os.kill(init, 9)
    with pytest.raises(errors.SandboxDied):
        client.exec(sid, "echo hi")
    assert client.list_sandboxes()[0]["alive"] is False
    assert client.destroy(sid) is True
    assert client.destroy(sid) is False


def test_other_peers_cannot_see_or_touch(helper, client, sandbox):
    other = helper.client(owner="someone-else")
    try:
        assert other.list_sandboxes() == []
        with pytest.raises(errors.NotFound):
            other.exec(sandbox, "true")
        assert other.destroy(sandbox) is False
        assert other.release_all() == 0
    finally:
        other.close()
    assert client.exec(sandbox, "echo still").output == "still\n"


def test_sandbox_usage_counts_cpu_memory_and_the_upper_and_is_the_owners_only(helper, client,
                                                                              sandbox):
    idle = client.sandbox_usage(sandbox)
    assert set(idle) >= {"cpu_s", "memory_peak_bytes", "disk_written_bytes"}
    r = client.exec(sandbox, "head -c 4194304 /dev/urandom > /tmp/blob && sync "
                    "&& i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done", timeout=120)
    assert r.exit_code == 0, r.output
    used = client.sandbox_usage(sandbox)
    # the loop ran in a command that has exited: its time still counts
    assert used["cpu_s"] > idle["cpu_s"] + 0.05, (idle, used)
    assert used["memory_peak_bytes"] >= 4 << 20 and used["disk_written_bytes"] >= 4 << 20, used
    other = helper.client(owner="someone-else")
    try:
        # another peer's sandbox is not found, like a missing one
        with pytest.raises(errors.NotFound):
            other.sandbox_usage(sandbox)
    finally:
        other.close()
    with pytest.raises(errors.NotFound):
        client.sandbox_usage("0" * 16)


def test_hostname_and_loopback(client, rootfs):
    sid = client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=1.0, pids_max=32,
                                hostname="episode-7")
    try:
        r = client.exec(sid, "cat /proc/sys/kernel/hostname; cat /sys/class/net/lo/operstate; ls /sys/class/net")
        assert r.output.split() == ["episode-7", "unknown", "lo"]
    finally:
        client.destroy(sid)


def test_concurrent_execs_in_many_sandboxes(client, rootfs):
    from concurrent.futures import ThreadPoolExecutor
    ids = [client.create_sandbox([str(rootfs)], memory_bytes=64 << 20, cpu_quota=0.5, pids_max=32)
           for _ in range(6)]
    try:
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda s: client.exec(s, "sleep 0.3; hostname; echo $$").output, ids))
        assert all(o.split() == ["sandbox", "1"] or o.split()[0] == "sandbox" for o in outs)
    finally:
        assert client.release_all() == len(ids)


def test_a_daemon_writing_forever_does_not_hold_the_reply(client, sandbox):
    r = client.exec(sandbox, "setsid bash -c 'while :; do echo spam; done' & sleep 0.2; echo done",
                    timeout=10)
    assert r.exit_code == 0 and not r.timed_out and r.duration < 5
    # The spammer dies with the sandbox (the fixture destroys it).


def test_kill_commands_frees_a_filled_pids_limit_from_outside(helper, client, rootfs):
    """A detached fork loop fills the sandbox's pids limit: a command that
    forks cannot get a pid (it would hang until its timeout). KillCommands
    kills every process but init through the freezer, from outside, and
    waits until they are gone: the next command runs at once, and a second
    KillCommands finds nothing (idempotent)."""
    sid = client.create_sandbox([str(rootfs)], memory_bytes=256 << 20, cpu_quota=1.0,
                                pids_max=64)
    try:
        r = client.exec(sid, "nohup setsid bash -c 'while :; do sleep 1000 & done' "
                        ">/dev/null 2>&1 & sleep 2; echo started", timeout=30)
        assert r.exit_code == 0 and "started" in r.output, r
        # Every pid but a few (the loop's own, init's) is held.
        assert client.kill_commands(sid) >= 56
        r = client.exec(sid, "ls /proc | grep -c '^[0-9]'", timeout=10)
        # init, bash and grep (ls has exited or not: 3 or 4)
        assert r.exit_code == 0 and not r.timed_out and int(r.output) <= 4, r
        assert client.kill_commands(sid) == 0
        other = helper.client(owner="someone-else")
        try:
            with pytest.raises(errors.NotFound):
                other.kill_commands(sid)
        finally:
            other.close()
    finally:
        client.destroy(sid)
    with pytest.raises(errors.NotFound):
        client.kill_commands(sid)
