"""The escape battery: an agent (and the sandbox's root) trying to get out.

Each probe runs inside a real sandbox of the rig's helper, over Debian
minbase plus an "image" layer holding setuid-root binaries, and prints
BLOCKED when the attempt failed the way it must. Resource probes (fork
bomb, memory hog, disk and inode exhaustion of the upper and of /dev/shm,
output flood) and copy-out races are checked from the host side as well.
Every probe is one row of the printed detail; the suite's table row counts
them.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import socket
import stat
import tarfile
from pathlib import Path

from devtools.reliability.rig import CACHE, Helper, minbase
from devtools.reliability.table import Row


def _sys(nr: int, *args, ok=("EPERM",)) -> str:
    """A raw syscall from perl: BLOCKED when it fails with one of ``ok``."""
    # perl's syscall() wants strings in variables (it may write through them).
    decl = "".join(f'my $s{i} = "{x}"; ' for i, x in enumerate(args) if not isinstance(x, int))
    a = ", ".join(str(x) if isinstance(x, int) else f"$s{i}" for i, x in enumerate(args))
    errs = " || ".join(f"$!{{{e}}}" for e in ok)
    return (f"perl -e '{decl}my $r = syscall({nr}{', ' if a else ''}{a}); "
            f"print(($r == -1 && ({errs})) ? \"BLOCKED\" : \"ESCAPED r=$r err=$!\")'")


def _fails(command: str) -> str:
    return f"if {command} >/dev/null 2>&1; then echo ESCAPED; else echo BLOCKED; fi"


def listener_unreached(listener: socket.socket) -> tuple[str, bool, str]:
    """The battery's row for the host's loopback listener: no probe may have
    connected to it."""
    listener.settimeout(0.1)
    try:
        listener.accept()
        return ("host listener never reached", False, "a connection arrived")
    except socket.timeout:
        return ("host listener never reached", True, "no connection")


def _absent(path: str) -> str:
    return f"if test -e {path} || test -L {path}; then echo ESCAPED; else echo BLOCKED; fi"


def probes(secret: Path, helper_socket: str, helper_state: str, port: int) -> list[tuple]:
    """(name, user, command) — the command prints BLOCKED when blocked."""
    caps = "$((16#$(awk '/CapEff/{print $2}' /proc/self/status)))"
    return [
        ("host file invisible", "root", _absent(str(secret))),
        ("helper socket invisible", "root", _absent(helper_socket)),
        ("helper state invisible", "root", _absent(helper_state)),
        ("docker socket invisible", "root",
         f"{_absent('/var/run/docker.sock')} | grep -q BLOCKED && {_absent('/run/docker.sock')}"),
        ("/proc/sys write (root)", "root", _fails("sh -c 'echo 1 > /proc/sys/vm/drop_caches'")),
        ("/proc/sysrq-trigger write (root)", "root", _fails("sh -c 'echo h > /proc/sysrq-trigger'")),
        ("/sys write (root)", "root", _fails("sh -c 'echo 1 > /sys/kernel/profiling'")),
        ("/proc/kcore masked (root)", "root",
         "test \"$(head -c 16 /proc/kcore 2>/dev/null | wc -c)\" = 0 && echo BLOCKED"),
        ("/proc/1/mem of init (root)", "root", _fails("dd if=/proc/1/mem bs=1 count=1")),
        ("/proc/1/root of init (agent)", "agent", _fails("ls /proc/1/root/")),
        ("ptrace attach init (root)", "root", _sys(101, 16, 1, 0, 0)),
        ("ptrace attach init (agent)", "agent", _sys(101, 16, 1, 0, 0)),
        ("mount tmpfs (root)", "root", _fails("mount -t tmpfs none /mnt")),
        ("mount syscall (root)", "root", _sys(165, "none", "/mnt", "tmpfs", 0, 0)),
        ("cgroupfs mount (root)", "root", _fails("mount -t cgroup -o memory none /mnt")),
        ("cgroup escape via /sys (root)", "root",
         _fails("sh -c 'echo $$ > /sys/fs/cgroup/memory/cgroup.procs'")),
        ("user namespace (agent)", "agent", _fails("unshare -U -r true")),
        ("mount namespace (root)", "root", _fails("unshare -m true")),
        ("unshare(CLONE_NEWUSER) syscall", "agent", _sys(272, 0x10000000)),
        ("setns into init's netns (root)", "root", _fails("nsenter -t 1 -n true")),
        ("setns syscall", "root", _sys(308, 0, 0)),
        ("clone3 refused", "agent", _sys(435, 0, 0, ok=("ENOSYS",))),
        ("x32 ABI refused", "agent", _sys(0x40000000 + 39, ok=("ENOSYS",))),
        ("agent has no capabilities", "agent",
         f"test {caps} = 0 && echo BLOCKED"),
        ("root lacks SYS_ADMIN/NET_ADMIN/PTRACE/MODULE/NET_RAW/SYS_TIME", "root",
         f"v={caps}; test $(( v & ((1<<21)|(1<<12)|(1<<19)|(1<<16)|(1<<13)|(1<<25)) )) = 0 "
         "&& echo BLOCKED"),
        ("no_new_privs and seccomp on", "agent",
         "grep -q '^NoNewPrivs:.1' /proc/self/status && grep -q '^Seccomp:.2' /proc/self/status "
         "&& echo BLOCKED"),
        ("keyring add_key", "agent", _sys(248, "user", "k", "v", 1, -2)),
        ("keyring keyctl", "agent", _sys(250, 0, -1, 0)),
        ("bpf", "root", _sys(321, 0, 0, 0)),
        ("perf_event_open", "agent", _sys(298, 0, 0, -1, -1, 0)),
        ("userfaultfd", "agent", _sys(323, 0)),
        ("io_uring_setup", "agent", _sys(425, 1, 0)),
        ("open_by_handle_at (root)", "root", _sys(304, 0, 0, 0)),
        ("init_module (root)", "root", _sys(175, 0, 0, "")),
        ("kexec_load (root)", "root", _sys(246, 0, 0, 0, 0)),
        ("reboot (root)", "root", _sys(169, 0xfee1dead, 672274793, 0x1234567)),
        ("raw packet socket (root)", "root", _sys(41, 17, 3, 768, ok=("EPERM", "EACCES"))),
        ("raw ICMP socket (root)", "root", _sys(41, 2, 3, 1, ok=("EPERM", "EACCES"))),
        ("host loopback unreachable", "agent",
         _fails(f"timeout 3 bash -c 'echo x > /dev/tcp/127.0.0.1/{port}'")),
        ("no route beyond loopback", "agent",
         _fails("timeout 3 bash -c 'echo x > /dev/tcp/192.0.2.1/80'")),
        ("only lo in the netns", "agent",
         "test \"$(tail -n +3 /proc/net/dev | awk -F: '{print $1}' | tr -d ' ')\" = lo "
         "&& echo BLOCKED"),
        ("host pids invisible", "agent",
         "test $(ls /proc | grep -cE '^[0-9]+$') -le 6 && echo BLOCKED"),
        ("kill init (agent)", "agent", _fails("kill -9 1")),
        ("set hostname (agent)", "agent", _fails("hostname evil")),
        ("set clock (root)", "root", _fails("date -s @0")),
        ("mknod block device (root)", "root", _fails("mknod /tmp/sda b 8 0")),
        ("no block devices in /dev", "agent",
         "test $(find /dev -type b | wc -l) = 0 && echo BLOCKED"),
        ("chroot breakout (root)", "root",
         "perl -e 'mkdir \"/tmp/x\"; chroot \"/tmp/x\"; chdir \"..\" for 1..64; chroot \".\"; "
         f"print((-e \"{secret}\") ? \"ESCAPED\" : \"BLOCKED\")'"),
        ("setuid binary in the image", "agent",
         "test \"$(/usr/local/bin/suid-id -u)\" = 2000 && echo BLOCKED"),
        ("setuid shell in the image", "agent",
         "test \"$(/usr/local/bin/suid-bash -p -c 'id -u')\" = 2000 && echo BLOCKED"),
    ]


def _image_layer(root: Path) -> Path:
    """A lower with setuid-root copies of id and bash, as a hostile image would ship."""
    layer = root / "reliability-suid-image"
    bindir = layer / "usr" / "local" / "bin"
    if not (bindir / "suid-bash").exists():
        bindir.mkdir(parents=True, exist_ok=True)
        for src, name in (("usr/bin/id", "suid-id"), ("bin/bash", "suid-bash")):
            shutil.copy2(minbase() / src, bindir / name)
            os.chown(bindir / name, 0, 0)
            os.chmod(bindir / name, 0o4755 | stat.S_IRWXU)
    return layer


def _tar(members: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data[m.name]) if m.name in data else None)
    return buf.getvalue()


def run(helper: Helper, verbose: bool = True) -> tuple[Row, list[tuple[str, bool, str]]]:
    secret = helper.base / f"host-secret-{secrets.token_hex(4)}"
    token = f"CAMG-HOST-SECRET-{secrets.token_hex(8)}"
    secret.write_text(token)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    client = helper.client(owner="escape")
    lowers = [str(minbase()), str(_image_layer(CACHE / "helper"))]
    spec = dict(memory_bytes=256 << 20, cpu_quota=1.0, pids_max=128, upper_bytes=64 << 20)
    results: list[tuple[str, bool, str]] = []
    sandboxes = []

    def new() -> str:
        sandboxes.append(client.create_sandbox(lowers, **spec))
        return sandboxes[-1]
    new.lowers, new.spec, new.made = lowers, spec, sandboxes

    try:
        sid = new()
        for name, user, command in probes(secret, helper.socket, helper.config["state_dir"], port):
            r = client.exec(sid, command, user=user, timeout=30)
            out = r.output.strip()
            results.append((name, out.endswith("BLOCKED"), out[-160:]))
        results += _copy_out(client, sid, secret, token)
        results += _resources(client, helper, new)
        results.append(listener_unreached(listener))
        results.append(("host secret unchanged", secret.read_text() == token, ""))
        results.append(("helper alive after the battery", helper.alive(), ""))
    finally:
        for sid in sandboxes:
            client.destroy(sid)
        client.close()
        listener.close()
        secret.unlink()
    gaps = [n for n, ok, _ in results if ok is None]
    probed = [r for r in results if r[1] is not None]
    blocked = sum(ok for _, ok, _ in probed)
    row = Row("escape", "sandbox", f"{len(probed)} probes from inside an agent sandbox",
              f"{blocked}/{len(probed)} blocked" + "".join(
                  f"; NOT BLOCKED: {n}" for n, ok, _ in probed if not ok)
              + "".join(f"; known gap: {n}" for n in gaps),
              blocked == len(probed))
    return row, results


def _copy_out(client, sid: str, secret: Path, token: str) -> list[tuple[str, bool, str]]:
    out = []
    client.exec(sid, f"ln -s {secret} /tmp/link; mkdir -p /tmp/d; ln -s / /tmp/d/root; "
                "ln /etc/passwd /tmp/hard 2>/dev/null; true")
    for path in ("/tmp/link", "/tmp/d"):
        blob = client.get_archive(sid, path)
        out.append((f"copy-out of symlink {path}", token.encode() not in blob, f"{len(blob)} B"))
    hard = client.exec(sid, "test -e /tmp/hard && echo made || echo refused").output.strip()
    out.append(("hardlink to a root file (protected_hardlinks)", hard == "refused", hard))
    # A swapping symlink/directory race during many copy-outs.
    client.exec(sid, "mkdir -p /tmp/r/real && echo inside > /tmp/r/real/f && "
                "(setsid bash -c 'for i in $(seq 1 4000); do ln -sfn / /tmp/r/x; "
                "rm -f /tmp/r/x; ln -sfn /tmp/r/real /tmp/r/x; done' &) ; true")
    leaked = 0
    for _ in range(20):
        try:
            leaked += token.encode() in client.get_archive(sid, "/tmp/r")
        except Exception:
            pass  # a member vanishing mid-archive is a failed copy, not a leak
    out.append(("symlink race on copy-out", leaked == 0, f"{leaked} leaks in 20 archives"))
    # Extraction of hostile members: absolute, dot-dot, symlink then through it.
    target = f"/tmp/camg-escape-{os.getpid()}-{secrets.token_hex(4)}"
    members = []
    for name, kind, link in (("abs", tarfile.SYMTYPE, "/"), ("abs/" + target.lstrip("/"), None, ""),
                             ("../../../../" + target.lstrip("/"), None, ""),
                             ("hl", tarfile.LNKTYPE, str(secret))):
        info = tarfile.TarInfo(name)
        if kind:
            info.type, info.linkname = kind, link
        else:
            info.size = 4
        members.append(info)
    data = {m.name: b"evil" for m in members if not m.type or m.type == tarfile.REGTYPE}
    try:
        client.put_archive(sid, "/tmp/in", _tar(members, data), user="agent")
    except Exception:
        pass  # refusing the archive is as good as confining it
    out.append(("hostile tar members on copy-in", not os.path.exists(target), target))
    return out


def _resources(client, helper: Helper, new) -> list[tuple[str, bool, str]]:
    out = []
    sid = new()
    before = helper.rss_kib()
    r = client.exec(sid, "yes", timeout=3, output_limit=4096)
    grown = helper.rss_kib() - before
    out.append(("output flood", r.truncated and r.timed_out and grown < 32 << 10,
                f"helper RSS +{grown} KiB"))
    r = client.exec(sid, "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; rm -f /tmp/fill",
                    timeout=60)
    out.append(("disk exhaustion of the upper (tmpfs, 64 MiB)", "No space left" in r.output,
                r.output.strip().splitlines()[0][-80:]))
    r = client.exec(sid, "i=0; while : 2>/dev/null > /tmp/i$i; do i=$((i+1)); "
                    "[ $i -ge 100000 ] && break; done; echo $i; rm -rf /tmp/i*", timeout=120)
    made = int(r.output.split()[0]) if r.output.split() and r.output.split()[0].isdigit() else -1
    out.append(("inode exhaustion of the upper", 0 <= made < 100000, f"{made} files"))
    # /dev/shm is a tmpfs of its own (sbxinit.c; helper/config.py Ceilings.shm:
    # 64 MiB here, half the 256 MiB memory at most, 4096 inodes): ENOSPC
    # inside the bound, never the memory cgroup's OOM killer.
    kills = _oom_kills(helper, sid)
    r = client.exec(sid, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200 2>&1; "
                    "echo kib=$(du -k /dev/shm/fill | cut -f1); rm -f /dev/shm/fill", timeout=60)
    kib = r.output.rsplit("kib=", 1)[-1].strip()
    oom = _oom_kills(helper, sid) - kills
    out.append(("disk exhaustion of /dev/shm (64 MiB tmpfs)",
                "No space left" in r.output and kib.isdigit() and int(kib) <= 64 << 10 and oom == 0,
                f"ENOSPC at {kib} KiB; OOM kills +{oom}"))
    r = client.exec(sid, "cd /dev/shm && i=0; while : 2>/dev/null > i$i; do i=$((i+1)); "
                    "[ $i -ge 100000 ] && break; done; echo $i; rm -f i*", timeout=120)
    made = int(r.output.split()[0]) if r.output.split() and r.output.split()[0].isdigit() else -1
    out.append(("inode exhaustion of /dev/shm (4096 inodes)", 0 <= made < 4096, f"{made} files"))
    bomb = new()
    # The caller stays (sleep): the bomb must meet pids.max, not the
    # process-group kill that follows a command's exit.
    client.exec(bomb, ":(){ :|:& };:; sleep 4", timeout=8)
    alive = client.exec(bomb, "echo alive", timeout=30).output.strip()
    hits = _pids_max_events(helper, bomb)
    out.append(("fork bomb", hits > 0 and alive.endswith("alive"),
                f"pids.max refused {hits} forks; sandbox {alive[-10:]}"))
    # A disk upper (AutoResearch's) is its own 64 MiB filesystem (helper/uppers.py).
    disk = client.create_sandbox(new.lowers, **dict(new.spec, upper="disk"))
    new.made.append(disk)
    r = client.exec(disk, "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1; rm -f /tmp/fill; "
                    "i=0; while : 2>/dev/null > /tmp/i$i; do i=$((i+1)); "
                    "[ $i -ge 100000 ] && break; done; echo files=$i", timeout=300)
    files = r.output.rsplit("files=", 1)[-1].strip()
    out.append(("disk and inode exhaustion of a disk upper (64 MiB)",
                "No space left" in r.output and files.isdigit() and int(files) < 100000,
                f"dd stopped by ENOSPC; {files} files"))
    hog = new()
    r = client.exec(hog, "head -c 2000000000 /dev/zero | tail > /dev/null", timeout=60)
    alive = client.exec(hog, "echo alive", timeout=30).output.strip()
    out.append(("memory hog (256 MiB cgroup)", r.exit_code != 0 and alive.endswith("alive"),
                f"exit {r.exit_code}"))
    return out


def _oom_kills(helper: Helper, sandbox: str) -> int:
    parent = Path(helper.config["cgroup_parents"]["memory"])
    for name in os.listdir(parent):
        if sandbox in name:
            for line in (parent / name / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return 0


def _pids_max_events(helper: Helper, sandbox: str) -> int:
    parent = Path(helper.config["cgroup_parents"]["pids"])
    for name in os.listdir(parent):
        if sandbox in name:
            events = (parent / name / "pids.events").read_text().split()
            return int(events[1]) if len(events) == 2 else 0
    return 0


def print_detail(results: list[tuple[str, bool, str]]) -> str:
    w = max(len(n) for n, _, _ in results)
    word = {True: "blocked", False: "NOT BLOCKED", None: "known gap"}
    return "\n".join(f"  {word[ok]:<11}  {n:<{w}}  {d}" for n, ok, d in results)
