"""Forks of the helper's sandboxes (ForkSandbox, helper/forks.py) and of the
episodes built on them (Coding, AutoResearch; issue 26).

The verb tests use the session helper; the episode tests build Coding's and
AutoResearch's environments as their own acceptance modules do (the
fixtures' code is theirs, imported as functions). Every test ends with the
conftest's leak check (mounts, cgroups, processes, state roots).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import conftest as pc
from camg import errors
from helper import cgroups

SPEC = dict(memory_bytes=256 << 20, cpu_quota=1.0, pids_max=128)
# The minimal rootfs has no procps: processes named sleep, from /proc.
SLEEPS = "grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"
KILL_SLEEPS = ("for f in $(grep -lx sleep /proc/[0-9]*/comm 2>/dev/null); do p=${f#/proc/}; "
               "kill ${p%/comm}; done; sleep 0.3")


def out(client, sid, command, user="root"):
    r = client.exec(sid, command, user=user)
    return r.output.strip()


def _uppers(helper) -> list[str]:
    return sorted(os.listdir(helper.config["upper_root"]))


def _warm(helper) -> int:
    """Loop devices backed by an unnamed image under the helper's upper_root:
    its warm uppers (helper/upper_pool.py) and the placed ones."""
    prefix = helper.config["upper_root"].rstrip("/") + "/#"
    n = 0
    for dev in Path("/sys/block").glob("loop*"):
        try:
            n += (dev / "loop" / "backing_file").read_text().startswith(prefix)
        except FileNotFoundError:
            pass  # not attached
    return n


def _wait_warm(helper, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _warm(helper) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _warm(helper) >= n, f"{_warm(helper)} warm uppers, wanted {n}"


def _no_warm_left(helper, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _warm(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _warm(helper) == 0, "warm uppers left behind"


@pytest.fixture
def unpooled(lower_root, rootfs):
    """A helper keeping no warm uppers: every fork makes its child's ext4."""
    base = Path(tempfile.mkdtemp(prefix="camg-fork-unpooled-"))
    base.chmod(0o711)
    cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                           ceilings={"warm_uppers": 0})
    helper = pc.start_helper(base, cfg)
    client = helper.client(owner="unpooled")
    try:
        yield helper, client
    finally:
        client.release_all()
        client.close()
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)


# -- the verb ----------------------------------------------------------------------

@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_fork_carries_files_and_isolates_both_ways(client, rootfs, helper, upper):
    parent = client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=64 << 20)
    try:
        out(client, parent, "echo before > /tmp/shared && echo gone > /tmp/deleted && "
                            "rm /tmp/deleted && echo x > /etc/motd-extra && rm -f /etc/issue")
        reply = client.fork_sandbox(parent)
        child = reply["sandbox_id"]
        assert reply["depth"] == 1 and child != parent
        assert {s["sandbox_id"] for s in client.list_sandboxes()} == {parent, child}
        for sid in (parent, child):
            # what the parent wrote, deleted (a whiteout) and removed from a lower
            assert out(client, sid, "cat /tmp/shared /etc/motd-extra; ls /tmp/deleted /etc/issue "
                                    "2>&1 | wc -l") == "before\nx\n2"
        out(client, child, "echo child > /tmp/c && echo child-edit > /tmp/shared && rm /etc/motd-extra")
        out(client, parent, "echo parent > /tmp/p && echo parent-edit >> /tmp/shared")
        assert out(client, parent, "cat /tmp/shared; ls /tmp/c 2>&1; cat /etc/motd-extra") == \
            "before\nparent-edit\nls: cannot access '/tmp/c': No such file or directory\nx"
        assert out(client, child, "cat /tmp/shared; ls /tmp/p 2>&1; ls /etc/motd-extra 2>&1") == \
            ("child-edit\nls: cannot access '/tmp/p': No such file or directory\n"
             "ls: cannot access '/etc/motd-extra': No such file or directory")
        # the agent keeps its rights on both sides; the rootfs lower is untouched
        assert out(client, child, "echo a > /tmp/agent-file && cat /tmp/agent-file", user="agent") == "a"
        assert (rootfs / "etc" / "issue").exists() and not (rootfs / "tmp" / "shared").exists()
        if upper == "disk":  # each side's own filesystem, mounted on its upper
            tops = [os.path.join(helper.config["upper_root"], n) for n in _uppers(helper)
                    if not n.endswith(".img")]
            assert len(tops) == 2 and all(os.path.ismount(t) for t in tops)
            assert len({os.stat(t).st_dev for t in tops}) == 2
        assert client.destroy(child) and client.destroy(parent)
        assert client.destroy(child) is False  # idempotent: already gone
    finally:
        client.release_all()
    assert _uppers(helper) == []


def test_another_peers_sandbox_cannot_be_forked(client, helper, sandbox):
    other = helper.client(owner=f"other{os.getpid()}")
    try:
        with pytest.raises(errors.NotFound):
            other.fork_sandbox(sandbox)
        with pytest.raises(errors.NotFound):
            client.fork_sandbox("0" * 16)
        assert other.list_sandboxes() == []
    finally:
        other.close()
    assert [s["sandbox_id"] for s in client.list_sandboxes()] == [sandbox]


# What the chain below does at some levels, beyond writing /tmp/level-N: a
# delete of an older layer's file (a whiteout), a lower's directory replaced
# (an opaque directory), a layer's directory replaced, a hard link, a
# symlink, modes and owners; each must come through every squash as it was.
EDITS = {
    3: "mkdir /tmp/d && echo a > /tmp/d/a && echo keep > /tmp/d/keep",
    5: "rm -rf /etc/apt && mkdir /etc/apt && echo mine > /etc/apt/mine",
    7: "rm /etc/issue && echo x > /tmp/gone-later",
    11: "rm -rf /tmp/d && mkdir /tmp/d && echo b > /tmp/d/b && rm /tmp/gone-later",
    13: "ln /tmp/level-13 /tmp/hard-13 && ln -s level-13 /tmp/sym-13",
    17: "chmod 0600 /tmp/level-17 && chown 2000:2000 /tmp/level-17 && mkdir -m 0700 /tmp/priv",
    30: "rm -rf /etc/apt/mine /usr/share/doc",
    40: "mkdir /usr/share/doc && echo back > /usr/share/doc/back",
}
CHAIN_VIEW = ("ls /tmp | grep -vc '^level-'; ls /tmp | grep -c '^level-'; ls /tmp/d /etc/apt; "
              "ls /etc/issue /tmp/gone-later 2>&1 | wc -l; stat -c '%h %u %a' /tmp/level-13 "
              "/tmp/level-17 /tmp/priv; readlink /tmp/sym-13; ls /usr/share/doc")


def _chain_view(levels: int) -> str:
    """What CHAIN_VIEW prints in a sandbox that saw EDITS up to ``levels``
    (at least 40)."""
    return "\n".join(["4", str(levels), "/etc/apt:", "", "/tmp/d:", "b", "2",
                      "2 0 644", "1 2000 600", "2 0 700", "level-13", "back"])


@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_a_chain_writing_at_every_level_is_squashed_past_the_bound(client, rootfs, helper,
                                                                    upper):
    """A chain of forks of forks 64 deep, each level writing: past
    ceilings.fork_depth (8) stacked layers the helper squashes them (and the
    upper) into one, and the next fork is at depth 1 again. Every level sees
    exactly what was written, deleted and replaced above it; an ancestor
    only what it had itself."""
    chain = [client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=64 << 20)]
    try:
        for level in range(1, 65):
            out(client, chain[-1], f"echo {level} > /tmp/level-{level}"
                                   + (f" && {EDITS[level]}" if level in EDITS else ""))
            reply = client.fork_sandbox(chain[-1])
            assert reply["depth"] == (level - 1) % 8 + 1, (level, reply)
            chain.append(reply["sandbox_id"])
            if level % 16 == 0:  # ancestors go: the layers outlive them
                for sid in chain[-16:-8]:
                    assert client.destroy(sid)
        assert out(client, chain[-1], CHAIN_VIEW) == _chain_view(64)
        assert out(client, chain[-2], CHAIN_VIEW) == _chain_view(64)  # the last parent
        assert out(client, chain[-8], "ls /tmp | grep -c '^level-'") == "58"  # wrote 58, forked
        assert out(client, chain[-1], "cat /tmp/level-1 /tmp/level-64 /tmp/d/b") == "1\n64\nb"
        assert not (rootfs / "tmp" / "level-1").exists() and (rootfs / "etc" / "issue").exists()
    finally:
        client.release_all()
    assert _uppers(helper) == []


def _tree(root: Path) -> dict:
    """Everything a reader of ``root`` sees: type, mode, owner, size,
    content or target, link count, by path."""
    seen = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            what = p.read_bytes() if p.is_file() and not p.is_symlink() else \
                os.readlink(p) if p.is_symlink() else None
            seen[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_nlink
                                              if not p.is_dir() else 0, what)
    return seen


def test_squash_shows_what_the_stacked_layers_showed(tmp_path):
    """helper/squash.py against the kernel: layers made by real overlay
    mounts (deletes of base files and of a layer's, a base directory
    replaced, a layer's directory replaced, renames, hard links, symlinks,
    modes, owners) and their squash, each stacked over the same base, read
    the same."""
    from helper import squash
    base, layers = tmp_path / "base", []
    for d in ("etc/apt/sources", "usr/doc", "var/empty"):
        (base / d).mkdir(parents=True)
    for f in ("etc/issue", "etc/apt/sources/main", "usr/doc/a", "usr/doc/b"):
        (base / f).write_text(f)
    (base / "link").symlink_to("etc")
    steps = [
        "mkdir /m/new && echo 1 > /m/new/one && echo 2 > /m/new/two && rm /m/etc/issue && "
        "echo x > /m/usr/doc/a && ln /m/new/one /m/new/one-link && chmod 700 /m/var/empty",
        "rm /m/new/two && rm -rf /m/etc/apt && mkdir -p /m/etc/apt/sources && echo mine > "
        "/m/etc/apt/sources/mine && mv /m/usr/doc/b /m/usr/doc/c && ln -s /m/new /m/sym && "
        "chown 2000:2000 /m/new/one",
        "rm -rf /m/new && mkdir /m/new && echo again > /m/new/again && rm /m/etc/apt/sources/mine"
        " && echo 3 > /m/var/empty/f && rm -rf /m/usr/doc && mkdir /m/usr/doc",
    ]
    mounts: list[Path] = []
    made = iter(range(100))

    def overlay(lowers: list[Path], upper: Path | None = None) -> Path:
        n = next(made)
        m = tmp_path / f"m{n}"
        m.mkdir()
        opts = "lowerdir=" + ":".join(str(p) for p in reversed(lowers))
        if upper is not None:
            work = tmp_path / f"w{n}"
            work.mkdir()
            opts += f",upperdir={upper},workdir={work}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(m)], check=True)
        mounts.append(m)
        return m

    try:
        for i, step in enumerate(steps):
            layer = tmp_path / f"l{i}"
            layer.mkdir()
            m = overlay([base, *layers], layer)
            subprocess.run(["sh", "-ec", step.replace("/m/", f"{m}/")], check=True)
            subprocess.run(["umount", str(m)], check=True)
            mounts.remove(m)
            layers.append(layer)
        squashed = tmp_path / "s"
        squashed.mkdir()
        squash.merge([str(p) for p in layers], str(squashed), [str(base)])
        want, got = _tree(overlay([base, *layers])), _tree(overlay([base, squashed]))
        assert got == want
        assert "etc/issue" not in got and "usr/doc/a" not in got
        assert got["new/again"][-1] == b"again\n"
        # past its time the copy stops, refused (a fork outlasting the
        # service's reset deadline would be a null child)
        late = tmp_path / "late"
        late.mkdir()
        with pytest.raises(squash.Refused, match="longer than"):
            squash.merge([str(p) for p in layers], str(late), [str(base)], seconds=0)
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", str(m)], check=False)


def test_a_squash_past_the_upper_size_is_refused(client, rootfs):
    """The squashed layer is bounded by the parent's upper size, counting
    what the merged view holds: a chain rewriting one file at every level
    squashes, one whose layers hold more than the size (each fork gives at
    least 1 MiB more) is refused limit_exceeded by name, and nothing is left
    of the attempt."""
    chain = [client.create_sandbox([str(rootfs)], **SPEC, upper_bytes=2 << 20)]
    try:
        for level in range(1, 10):
            out(client, chain[-1], f"head -c 900K /dev/zero > /tmp/log && echo {level} > /tmp/n")
            chain.append(client.fork_sandbox(chain[-1])["sandbox_id"])
        assert out(client, chain[-1], "cat /tmp/n; stat -c %s /tmp/log") == "9\n921600"
        client.release_all()
        chain = [client.create_sandbox([str(rootfs)], **SPEC, upper_bytes=2 << 20)]
        for level in range(1, 9):
            out(client, chain[-1], f"head -c 900K /dev/zero > /tmp/level-{level}")
            chain.append(client.fork_sandbox(chain[-1])["sandbox_id"])
        out(client, chain[-1], "head -c 900K /dev/zero > /tmp/last")
        before = len(client.list_sandboxes())
        with pytest.raises(errors.BadRequest) as refused:
            client.fork_sandbox(chain[-1])
        assert refused.value.details["helper_error"] == "limit_exceeded"
        assert "squashed" in str(refused.value) and "upper size" in str(refused.value)
        assert len(client.list_sandboxes()) == before
        assert out(client, chain[-1], "ls /tmp | wc -l") == "9"  # the parent goes on
        # a tree deeper than the copy goes is refused too, never a failed fork
        client.release_all()
        chain = [client.create_sandbox([str(rootfs)], **SPEC)]
        for level in range(1, 9):
            out(client, chain[-1], f"echo {level} > /tmp/level-{level}")
            chain.append(client.fork_sandbox(chain[-1])["sandbox_id"])
        # 3000 levels, 6000 bytes of path: past PATH_MAX for the copy
        deep = "$(printf 'd/%.0s' $(seq 1500))"
        out(client, chain[-1], f"cd /tmp && mkdir -p {deep} && cd {deep} && mkdir -p {deep}")
        with pytest.raises(errors.BadRequest) as refused:
            client.fork_sandbox(chain[-1])
        assert refused.value.details["helper_error"] == "limit_exceeded", refused.value
    finally:
        client.release_all()


@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_an_untouched_parent_forks_64_times_at_one_depth(client, rootfs, helper, upper):
    """What a trainer's group does: one prefix, many completions. The first
    fork freezes what the parent wrote (depth 1); the parent, untouched
    since, is forked 63 more times over that same layer: no new depth, and
    no new init (its /dev/shm, which no fork carries, survives them). Every
    child sees the parent's files and none of its siblings' writes."""
    parent = client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=32 << 20)
    try:
        out(client, parent, "echo prefix > /tmp/prefix && rm -f /etc/issue")
        first = client.fork_sandbox(parent)
        assert (first["depth"], first["reused"]) == (1, False)
        out(client, parent, "echo alive > /dev/shm/init-mark")
        children = [first["sandbox_id"]]
        for _ in range(63):
            reply = client.fork_sandbox(parent)
            assert (reply["depth"], reply["reused"]) == (1, True), reply
            children.append(reply["sandbox_id"])
        assert len(set(children)) == 64
        for i, sid in enumerate(children):
            out(client, sid, f"echo {i} > /tmp/own-{i}")
        out(client, parent, "echo parent > /tmp/own-parent")
        for i, sid in enumerate(children):
            assert out(client, sid, "ls /tmp /dev/shm; cat /tmp/prefix; ls /etc/issue 2>&1 | wc -l"
                       ) == f"/dev/shm:\n\n/tmp:\nown-{i}\nprefix\nprefix\n1", sid
        assert out(client, parent, "ls /tmp; cat /dev/shm/init-mark") == \
            "own-parent\nprefix\nalive"
        # a write makes the next fork freeze again: one layer more
        reply = client.fork_sandbox(parent)
        assert (reply["depth"], reply["reused"]) == (2, False)
        assert out(client, reply["sandbox_id"], "ls /tmp") == "own-parent\nprefix"
    finally:
        client.release_all()
    assert _uppers(helper) == []


def test_a_fresh_sandbox_forks_over_its_lowers(client, rootfs):
    """Nothing written yet: the child stands on the parent's lowers alone
    (depth 0), and a write on either side stays there."""
    parent = client.create_sandbox([str(rootfs)], **SPEC)
    try:
        reply = client.fork_sandbox(parent)
        assert (reply["depth"], reply["reused"]) == (0, True), reply
        child = reply["sandbox_id"]
        out(client, child, "echo c > /tmp/c")
        out(client, parent, "echo p > /tmp/p")
        assert out(client, child, "ls /tmp") == "c"
        assert out(client, parent, "ls /tmp") == "p"
        assert not (rootfs / "tmp" / "c").exists()
    finally:
        client.release_all()


@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_a_chain_of_untouched_forks_goes_64_deep(client, rootfs, helper, upper):
    """Tree search forks the node it just made: a chain of forks of forks
    that write nothing stays at the depth of the last write, far past
    ceilings.fork_depth (8); every level sees what was written above it."""
    chain = [client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=32 << 20)]
    try:
        out(client, chain[0], "echo top > /tmp/top")
        for level in range(1, 65):
            reply = client.fork_sandbox(chain[-1])
            assert reply["depth"] == 1 and reply["reused"] == (level > 1), (level, reply)
            chain.append(reply["sandbox_id"])
            if level % 16 == 0:  # drop ancestors: the layer outlives them
                for sid in chain[-16:-2]:
                    assert client.destroy(sid)
        assert out(client, chain[-1], "cat /tmp/top && echo deep > /tmp/deep") == "top"
        reply = client.fork_sandbox(chain[-1])
        assert (reply["depth"], reply["reused"]) == (2, False)
        assert out(client, reply["sandbox_id"], "cat /tmp/top /tmp/deep") == "top\ndeep"
        assert out(client, chain[-2], "ls /tmp") == "top"
    finally:
        client.release_all()
    assert _uppers(helper) == []


def test_a_running_process_is_refused_not_killed(client, sandbox):
    # The exec waits for the marker its setsid'd child writes: sbxinit kills
    # the exec's process group when it ends, and a child still in it then
    # died before setsid (the fork was allowed: a rehearsal at d0acf08 failed so).
    out(client, sandbox, "rm -f /tmp/.sleeping; setsid -f sh -c 'touch /tmp/.sleeping; exec sleep 300' "
                         "</dev/null >/dev/null 2>&1; "
                         "while [ ! -e /tmp/.sleeping ]; do sleep 0.01; done; "
                         # and for its exec: the marker comes from sh, before it is sleep
                         f"until [ $({SLEEPS}) = 1 ]; do sleep 0.01; done")
    with pytest.raises(errors.PermissionDenied) as refused:
        client.fork_sandbox(sandbox)
    assert refused.value.details["helper_error"] == "not_allowed"
    assert "processes" in str(refused.value)
    assert out(client, sandbox, SLEEPS) == "1"  # still running
    assert len(client.list_sandboxes()) == 1
    out(client, sandbox, KILL_SLEEPS)
    child = client.fork_sandbox(sandbox)["sandbox_id"]
    assert out(client, child, SLEEPS) == "0"  # the child's init is fresh
    client.destroy(child)


@pytest.mark.parametrize("upper", ["tmpfs", "disk", "disk-warm", "disk-unpooled"])
def test_disk_bound_holds_on_both_sides(request, client, helper, rootfs, upper):
    """A fork gives neither side more room than the parent had left: after
    20 of 48 MiB, each side meets ENOSPC within the rest. A disk child's
    ext4 is a warm one (disk-warm: the pool is waited for), one made at the
    fork (disk-unpooled: a helper with warm_uppers 0), or either (disk);
    its inodes are at most the parent filesystem's (an ext4 of the parent's
    configured size), and filling them meets ENOSPC too."""
    if upper == "disk-unpooled":
        helper, client = request.getfixturevalue("unpooled")
    kind = "tmpfs" if upper == "tmpfs" else "disk"
    parent = client.create_sandbox([str(rootfs)], **SPEC, upper=kind, upper_bytes=48 << 20)
    try:
        out(client, parent, "head -c 20M /dev/zero > /tmp/first && sync")
        if upper == "disk-warm":
            _wait_warm(helper, 2)  # the parent's own and at least one warm
        reply = client.fork_sandbox(parent)
        child = reply["sandbox_id"]
        assert reply["upper_bytes"] <= 29 << 20, reply
        if upper != "tmpfs":
            made = os.path.exists(os.path.join(helper.config["upper_root"],
                                               f"{cgroups.cgroup_name(child)}.img"))
            assert made == (upper == "disk-unpooled") or upper == "disk", made
        for sid in (parent, child):
            r = client.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M count=48 2>&1; "
                                 "stat -c %s /tmp/fill; rm -f /tmp/fill; stat -c %s /tmp/first")
            lines = r.output.splitlines()
            assert "No space left on device" in r.output, r.output
            assert int(lines[-2]) <= 29 << 20, r.output
            assert int(lines[-1]) == 20 << 20  # the frozen layer is intact
        if kind == "disk":
            inodes = {sid: int(out(client, sid, "df --output=itotal /tmp | tail -1"))
                      for sid in (parent, child)}
            assert 0 < inodes[child] <= inodes[parent], inodes
            r = client.exec(child, "mkdir /tmp/many && cd /tmp/many && i=0; "
                                   "while { : > f$i; } 2>/dev/null; do i=$((i+1)); done; echo $i; "
                                   ": > g 2>&1; cd / && rm -rf /tmp/many", timeout=300)
            assert "No space left on device" in r.output, r.output
            assert int(r.output.split()[0]) <= inodes[child], r.output
    finally:
        client.release_all()


@pytest.mark.parametrize("first", ["parent", "child"])
@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_destroy_in_either_order_keeps_the_other_whole(client, rootfs, helper, first, upper):
    """The shared layer outlives whichever side goes first, and a fork of
    the survivor still stacks it; the last user's destroy reclaims it (the
    leak check: no mount, loop device mount, cgroup or upper left)."""
    parent = client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=32 << 20)
    try:
        out(client, parent, "head -c 1M /dev/urandom > /tmp/blob && md5sum /tmp/blob > /tmp/sum")
        child = client.fork_sandbox(parent)["sandbox_id"]
        gone, kept = (parent, child) if first == "parent" else (child, parent)
        assert client.destroy(gone)
        assert out(client, kept, "md5sum -c /tmp/sum") == "/tmp/blob: OK"
        grandchild = client.fork_sandbox(kept)["sandbox_id"]
        assert client.destroy(kept)
        assert out(client, grandchild, "md5sum -c /tmp/sum && echo more > /tmp/more && "
                                       "cat /tmp/more") == "/tmp/blob: OK\nmore"
        assert client.destroy(grandchild)
    finally:
        client.release_all()
    assert _uppers(helper) == []


def test_sweep_after_a_killed_helper_leaves_no_layer(lower_root, rootfs):
    """Layers are held by descriptors and by the overlays that stack them:
    a helper killed mid-chain (a parent destroyed, its child and grandchild
    alive) takes them with it; --sweep reclaims the cgroups, disk uppers and
    records the ledger names, and nothing else is left (the leak check)."""
    base = Path(tempfile.mkdtemp(prefix="camg-fork-sweep-"))
    # No warm uppers: their mkfs would count among the helper's children
    # (a killed helper's pool: test_warm_uppers_are_bounded_and_go_with_the_helper).
    cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                           ceilings={"warm_uppers": 0})
    helper = pc.start_helper(base, cfg)
    try:
        client = helper.client(owner="sweep")
        parent = client.create_sandbox([str(rootfs)], **SPEC, upper="disk", upper_bytes=32 << 20)
        out(client, parent, "echo a > /tmp/a")
        child = client.fork_sandbox(parent)["sandbox_id"]
        assert client.fork_sandbox(child)["reused"]  # over the child's stack: one more user
        client.destroy(parent)
        client.close()
        inits = helper.sandbox_inits()
        assert len(inits) == 2
        helper.proc.send_signal(signal.SIGKILL)
        helper.proc.wait()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in inits) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(os.listdir(Path(cfg["state_dir"]) / "ledger")) == 2
        env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
        swept = subprocess.run([sys.executable, "-m", "helper", "--config",
                                str(base / "helper.json"), "--sweep"], cwd=pc.ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert swept.returncode == 0, swept.stderr
        assert swept.stderr.count("swept sandbox") == 2, swept.stderr
        assert os.listdir(cfg["upper_root"]) == []
        assert os.listdir(Path(cfg["state_dir"]) / "ledger") == []
    finally:
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("upper", ["tmpfs", "disk"])
def test_sweep_after_a_killed_helper_leaves_no_squashed_layer(lower_root, rootfs, upper):
    """A squashed layer is held like any other: a tmpfs one by descriptors
    only, a disk one inside its parent's ext4 (which the parent's record
    names). A helper killed with a squashed chain alive leaves nothing the
    sweep does not reclaim (the leak check: mounts, loop devices, cgroups)."""
    base = Path(tempfile.mkdtemp(prefix="camg-fork-sweep-squash-"))
    cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                           ceilings={"warm_uppers": 0})
    helper = pc.start_helper(base, cfg)
    try:
        client = helper.client(owner="sweep-squash")
        chain = [client.create_sandbox([str(rootfs)], **SPEC, upper=upper, upper_bytes=32 << 20)]
        for level in range(1, 10):
            out(client, chain[-1], f"echo {level} > /tmp/level-{level}")
            chain.append(client.fork_sandbox(chain[-1])["sandbox_id"])
        assert client.list_sandboxes() and len(chain) == 10
        for sid in chain[:8]:  # only the squashed pair is left
            client.destroy(sid)
        assert out(client, chain[-1], "ls /tmp | wc -l") == "9"
        client.close()
        inits = helper.sandbox_inits()
        assert len(inits) == 2
        helper.proc.send_signal(signal.SIGKILL)
        helper.proc.wait()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in inits) and time.monotonic() < deadline:
            time.sleep(0.05)
        env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
        swept = subprocess.run([sys.executable, "-m", "helper", "--config",
                                str(base / "helper.json"), "--sweep"], cwd=pc.ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert swept.returncode == 0, swept.stderr
        assert swept.stderr.count("swept sandbox") == 2, swept.stderr
        assert os.listdir(cfg["upper_root"]) == []
        assert os.listdir(Path(cfg["state_dir"]) / "ledger") == []
    finally:
        pc.stop_helper(helper)
        shutil.rmtree(base, ignore_errors=True)


def test_warm_uppers_are_bounded_and_go_with_the_helper(lower_root, rootfs):
    """The pool holds at most ceilings.warm_uppers entries (loop devices over
    unnamed images, mounted nowhere), refills what forks take, and leaves
    nothing behind: not at a stop (SIGTERM), not when the helper is killed
    (the kernel frees them with its descriptors; the sweep has nothing to
    find)."""
    for ending in ("stop", "kill"):
        base = Path(tempfile.mkdtemp(prefix="camg-fork-warm-"))
        cfg = pc.helper_config(base, lower_root, rootfs, probe_on_start=False,
                               ceilings={"warm_uppers": 2})
        helper = pc.start_helper(base, cfg)
        try:
            client = helper.client(owner="warm")
            assert _warm(helper) == 0  # nothing before a disk create names a size
            parent = client.create_sandbox([str(rootfs)], **SPEC, upper="disk",
                                           upper_bytes=32 << 20)
            _wait_warm(helper, 2)
            time.sleep(0.3)
            assert _warm(helper) == 2  # the ceiling (the parent's ext4 has a named image)
            child = client.fork_sandbox(parent)["sandbox_id"]
            assert not os.path.exists(os.path.join(cfg["upper_root"], f"{cgroups.cgroup_name(child)}.img"))
            _wait_warm(helper, 3)  # refilled: two warm, one placed
            time.sleep(0.3)
            assert _warm(helper) == 3
            assert out(client, child, "echo x > /tmp/x && cat /tmp/x") == "x"
            client.close()
            if ending == "stop":
                pc.stop_helper(helper)
            else:
                inits = helper.sandbox_inits()
                helper.proc.send_signal(signal.SIGKILL)
                helper.proc.wait()
                deadline = time.monotonic() + 10
                while any(os.path.exists(f"/proc/{p}") for p in inits) and \
                        time.monotonic() < deadline:
                    time.sleep(0.05)
                env = dict(os.environ, PYTHONPATH=str(pc.ROOT))
                swept = subprocess.run([sys.executable, "-m", "helper", "--config",
                                        str(base / "helper.json"), "--sweep"], cwd=pc.ROOT,
                                       env=env, capture_output=True, text=True, timeout=120)
                assert swept.returncode == 0, swept.stderr
                assert swept.stderr.count("swept sandbox") == 2, swept.stderr
            _no_warm_left(helper)
            assert os.listdir(cfg["upper_root"]) == []
        finally:
            pc.stop_helper(helper)
            shutil.rmtree(base, ignore_errors=True)


# -- Coding ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def coding_env(demo_set, demo_image, coding_helper, tmp_path_factory):
    """test_coding_episodes' environment, built the same way."""
    import test_coding_episodes as tc
    from camg.oci.images import write_materialized
    from environments.coding.prepare import prepare_coding
    work = tmp_path_factory.mktemp("coding-fork-prepared")
    images = work / "materialized-images.json"
    write_materialized(images, (demo_image.image,))
    manifest_path = work / "manifest.json"
    prepare_coding(rows_path=demo_set / "tasks.parquet", mirrors_root=demo_set / "mirrors",
                   images_path=images, output=manifest_path, layers_root=tc.CACHE / "layers")
    prepared = {"manifest": manifest_path, "images": images, "mirrors": demo_set / "mirrors",
                "work": work}
    environment = tc.make_env(prepared, coding_helper)
    environment.start()
    yield environment
    environment.stop()


FINISH = {"operation": "finish"}


def test_coding_fork_gold_on_one_branch_noop_on_the_other(coding_env, coding_helper):
    """The parent plays the reference's first step (a chunk of the gold patch
    shipped into /tmp), forks, then finishes as it is: 0.0. The child goes on
    with the reference from the same step (its step count is the parent's,
    and the shipped chunk is in its /tmp) and earns 1.0, integrity ok: its
    diff is taken from its own tree."""
    env = coding_env
    task = env.tasks[0]
    parent = env.create_episode(task, seed=None, episode_id="fork-parent")
    child = None
    try:
        parent.reset()
        first = parent.reference_action()
        assert first["operation"] == "shell"
        assert parent.step(first).observation["exit_code"] == 0
        child = parent.fork("fork-child")
        assert child.steps == parent.steps == 1
        assert child.sandbox != parent.sandbox and child.diff is None and child.report is None
        # the child has the parent's files, then neither sees the other's new
        # ones (the child looked at through the helper: none of its steps spent)
        assert env.helper.exec(child.sandbox, "test -s /tmp/.camg-reference.b64 && echo shipped",
                               user="agent").output.strip() == "shipped"
        parent.step({"operation": "shell", "command": "echo parent-only > /tmp/p"})
        probe = env.helper.exec(child.sandbox, "ls /tmp/p 2>&1 | wc -l; echo c > /tmp/c",
                                user="agent")
        assert probe.output.strip() == "1", probe.output  # ls's error line
        seen = parent.step({"operation": "shell", "command": "ls /tmp/c 2>&1 | wc -l; "
                            "git status --porcelain | wc -l"}).observation["output"].split()
        assert seen == ["1", "0"], seen
        for _ in range(50):
            action = child.reference_action()
            step = child.step(action)
            if step.done:
                break
        assert step.done
        assert child.grade() == 1.0, child.state()
        assert child.outcome()["integrity"] == "ok", child.outcome()
        done = parent.step(FINISH)
        assert done.done
        assert parent.grade() == 0.0, parent.state()
    finally:
        parent.close()
        if child is not None:
            child.close()
    assert env.helper.list_sandboxes() == []


def test_coding_child_is_graded_on_what_its_whole_path_did(coding_env):
    """What the parent did before the fork is the child's too: the gold
    fix applied before the fork earns the child 1.0 when it finishes at
    once, and the parent, reverting it, 0.0. No verdict or submission is
    carried (the parent's grade comes after the fork)."""
    env = coding_env
    task = env.tasks[0]
    patch = task.data["patch"]
    parent = env.create_episode(task, seed=None, episode_id="fork-gold-first")
    child = None
    try:
        parent.reset()
        fixed = parent.step({"operation": "shell",
                             "command": f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"})
        assert fixed.observation["exit_code"] == 0, fixed.observation
        child = parent.fork("fork-gold-child")
        reverted = parent.step({"operation": "shell", "command": "git checkout -- . && git status "
                                "--porcelain | wc -l"})
        assert reverted.observation["output"].strip() == "0"
        assert parent.step(FINISH).done and parent.grade() == 0.0
        assert child.step(FINISH).done and child.grade() == 1.0, child.state()
    finally:
        parent.close()
        if child is not None:
            child.close()


#: a GRPO group's breadth and a tree search's depth a trainer may ask
GROUP_BREADTH = 64
CHAIN_DEPTH = 64


def test_coding_group_and_deep_chain_keep_their_rewards(coding_env):
    """A trainer's group (64 forks of one untouched parent: far past the 8 a
    parent once allowed) and a tree search's chain (a fork of the last
    fork 64 times, writing every 4th level: squashed each time it reaches
    the stacking bound), from a parent that applied the gold fix. The deepest node finishing earns 1.0,
    integrity ok; a group member that reverts the fix earns 0.0: squash and
    reuse carry the files, not a reward."""
    env = coding_env
    task = env.tasks[0]
    patch = task.data["patch"]
    parent = env.create_episode(task, seed=None, episode_id="fork-group-parent")
    made = []
    try:
        parent.reset()
        fixed = parent.step(_shell(f"git apply -R - <<'CAMG_EOF'\n{patch}\nCAMG_EOF"))
        assert fixed.observation["exit_code"] == 0, fixed.observation
        for i in range(GROUP_BREADTH):
            made.append(parent.fork(f"fork-group-{i}"))
        node = made[0]
        stepped = 0
        for level in range(CHAIN_DEPTH):
            # a step every 4th level: 16 writes stack past the bound twice,
            # within the episode's step budget (Coding's max_steps)
            if level % 4 == 0:
                stepped += 1
                shown = node.step(_shell(f"echo {level} > /tmp/level-{level} && ls /tmp | "
                                         "grep -c level-")).observation["output"].split()
                assert shown == [str(stepped)], shown
            node = node.fork(f"fork-chain-{level}")
            made.append(node)
        assert node.step(FINISH).done and node.grade() == 1.0, node.state()
        assert node.outcome()["integrity"] == "ok", node.outcome()
        assert made[5].step(_shell("git checkout -- . && git status --porcelain | wc -l")) \
            .observation["output"].strip() == "0"
        assert made[5].step(FINISH).done and made[5].grade() == 0.0, made[5].state()
    finally:
        parent.close()
        for each in made:
            each.close()
    assert env.helper.list_sandboxes() == []


# -- AutoResearch ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ar_roots(rootfs):
    """test_autoresearch_episodes' roots and helper, built the same way."""
    import test_autoresearch_episodes as ta
    from camg.oci.images import write_materialized
    from environments.autoresearch.prepare import prepare
    from tools import oci_demo
    from environments.autoresearch.demo import demo_tasks, image
    research_image = image.ensure_image(oci_demo.cache_root_from_env())
    ta.ensure_grader_user()
    base = Path(tempfile.mkdtemp(prefix="camg-ar-fork-test-"))
    base.chmod(0o711)
    demo_tasks.build(base / "bundles")
    images = base / "materialized-images.json"
    write_materialized(images, (research_image.image,))
    roots = {"base": base, "packages": base / "packages", "workspaces": base / "workspaces",
             "private": base / "private", "images": images, "manifest": base / "manifest.json",
             "image": research_image}
    prepare(source=base / "bundles", packages_root=roots["packages"],
            workspaces_root=roots["workspaces"], private_root=roots["private"], images=images,
            image_name="camg/demo-autoresearch", output=roots["manifest"],
            grader_user=ta.GRADER_USER)
    hbase = base / "helper"
    cfg = pc.helper_config(hbase, roots["workspaces"], rootfs,
                           lower_roots=[str(oci_demo.cache_root_from_env()),
                                        str(roots["workspaces"]), str(pc.CACHE / "helper")],
                           private_roots=[str(roots["private"])])
    helper = pc.start_helper(hbase, cfg)
    pc.state_root(hbase / "state" / "ledger")
    pc.state_root(hbase / "uppers")
    environment = ta.make_env(roots, helper, base / "state-fork")
    environment.start()
    pc.allow_process(environment.grader.pid)
    yield roots, helper, environment
    environment.stop()
    pc.stop_helper(helper)
    shutil.rmtree(base)


def _shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


SUBMIT = {"operation": "submit"}


def test_autoresearch_fork_reference_on_one_branch_nothing_on_the_other(ar_roots):
    import test_autoresearch_episodes as ta
    roots, helper, env = ar_roots
    task = env.tasks[1]
    parent = env.create_episode(task, seed=None, episode_id="ar-fork-parent")
    child = None
    try:
        parent.reset()
        wrote = parent.step(ta.write_file("/workspace/solve.py", ta.reference(roots, task.task_id)))
        assert wrote.observation["exit_code"] == 0
        child = parent.fork("ar-fork-child")
        assert (child.steps, child.jobs, child.started) == (parent.steps, parent.jobs, parent.started)
        ran = child.step(_shell("python /workspace/solve.py && wc -l /workspace/submission.csv"))
        assert ran.observation["exit_code"] == 0, ran.observation
        assert parent.step(_shell("ls /workspace/submission.csv 2>&1 | wc -l")) \
            .observation["output"].strip() == "1"  # the child's submission is not the parent's
        assert child.step(SUBMIT).done
        reward = child.grade()
        assert reward >= 0.9, (reward, child.state())
        assert child.outcome()["integrity"] == "ok"
        assert parent.step(SUBMIT).done
        assert parent.grade() == 0.0, parent.state()
        assert parent.state()["grade"]["submitted"] is False
    finally:
        parent.close()
        if child is not None:
            child.close()
    assert env.helper.list_sandboxes() == []


def test_autoresearch_group_of_ten_forks_of_one_prefix(ar_roots):
    """Ten forks of one untouched parent (past the 8 a parent once
    allowed): the tenth runs the reference and earns it, the fourth submits
    nothing and earns 0.0; each grade is of its own workspace."""
    import test_autoresearch_episodes as ta
    roots, helper, env = ar_roots
    task = env.tasks[1]
    parent = env.create_episode(task, seed=None, episode_id="ar-group-parent")
    children = []
    try:
        parent.reset()
        wrote = parent.step(ta.write_file("/workspace/solve.py", ta.reference(roots, task.task_id)))
        assert wrote.observation["exit_code"] == 0
        for i in range(10):
            children.append(parent.fork(f"ar-group-{i}"))
        last, idle = children[9], children[3]
        ran = last.step(_shell("python /workspace/solve.py && wc -l /workspace/submission.csv"))
        assert ran.observation["exit_code"] == 0, ran.observation
        assert last.step(SUBMIT).done and last.grade() >= 0.9, last.state()
        assert idle.step(SUBMIT).done and idle.grade() == 0.0, idle.state()
    finally:
        parent.close()
        for each in children:
            each.close()
    assert env.helper.list_sandboxes() == []


def test_autoresearch_running_background_job_is_not_forkable(ar_roots):
    roots, helper, env = ar_roots
    episode = env.create_episode(env.tasks[0], seed=None, episode_id="ar-fork-bg")
    try:
        episode.reset()
        started = episode.step({"operation": "background", "command": "sleep 120"})
        assert started.observation["exit_code"] == 0
        # a forged exit file does not make the job look done: the helper counts processes
        episode.step(_shell("echo 0 > /workspace/.jobs/1.exit"))
        with pytest.raises(errors.NotForkable) as refused:
            episode.fork("ar-fork-bg-child")
        assert refused.value.details["what"] == "background_jobs"
        assert len(env.helper.list_sandboxes()) == 1
        # the episode goes on: the job still runs (its `sleep` may take a
        # moment to appear under load: the launcher only waits for its shell)
        still = f"for i in $(seq 100); do n=$({SLEEPS}); [ $n = 1 ] && break; sleep 0.1; done; echo $n"
        assert episode.step(_shell(still)).observation["output"].strip() == "1"
    finally:
        episode.close()
