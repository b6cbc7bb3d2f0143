"""The escape battery on the Docker substrate: probes from inside a General
agent container, made as General makes them (the task image by digest,
the transport as its command, the agent environment mounted read-only,
through the helper's ContainerCreate: ``--init``, no network, no-new-
privileges, NET_RAW/MKNOD/AUDIT_WRITE dropped, cpu/memory/pids limits).

Probes run as the agent (uid 2000, what a General shell action runs as)
and, where it matters, as the container's root (what a hostile image or a
transport bug would hold). Each prints BLOCKED when the attempt failed the
way it must; fork bomb and memory hog are checked from the host as well
(the container's pids cgroup, the container still running). A probe the
rig cannot decide is reported as a known gap, never as blocked; disk
exhaustion is decided, since each container's writable layer is a bounded
ext4 of its own (helper/container_disk.py).
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
from pathlib import Path

from devtools.reliability.escape import _absent, _fails, _sys, listener_unreached
from devtools.reliability.rig import Helper
from devtools.reliability.table import Row

AGENT_ENV = "/opt/camg/agent-env"
#: what the disk and inode probes try to write; more than the rig's bound
FILL_MIB = 1024
INODE_CAP = 100_000
TASK_ROOT = "/opt/mimo-task"


def probes(secret: Path, helper_socket: str, port: int) -> list[tuple[str, str, str]]:
    """(name, user, command); the command prints BLOCKED when blocked."""
    # The exec's shell is the image's sh (dash): capability sets in perl.
    def caps(test: str) -> str:
        return (f"perl -ne 'print(({test}) ? \"BLOCKED\" : \"ESCAPED $1\") "
                "if /^CapEff:\\s*(\\S+)/' /proc/self/status 2>/dev/null")
    dangerous = (1 << 21) | (1 << 12) | (1 << 19) | (1 << 16) | (1 << 13) | (1 << 25) | (1 << 27)
    # /sys/fs/cgroup is the container's own tmpfs (a directory made there
    # is no cgroup); every controller below it must be read-only, and the
    # process must stay in its cgroup.
    cgroup = ("c0=$(grep pids /proc/$$/cgroup); for f in /sys/fs/cgroup/*/cgroup.procs "
              "/sys/fs/cgroup/*/tasks; do (echo $$ > $f) 2>/dev/null; done; "
              "c1=$(grep pids /proc/$$/cgroup); made=; for d in /sys/fs/cgroup/*/; do "
              "mkdir ${d}x 2>/dev/null && made=\"$made $d\"; done; "
              "if [ \"$c0\" = \"$c1\" ] && [ -z \"$made\" ]; then echo BLOCKED; "
              "else echo \"ESCAPED moved=$c1 made=$made\"; fi")
    return [
        ("docker socket absent", "root",
         f"{_absent('/var/run/docker.sock')} | grep -q BLOCKED && {_absent('/run/docker.sock')}"),
        ("helper socket absent", "root", _absent(helper_socket)),
        ("host file invisible", "root", _absent(str(secret))),
        ("only lo in the netns (network none)", "agent",
         "test \"$(tail -n +3 /proc/net/dev | awk -F: '{print $1}' | tr -d ' ')\" = lo "
         "&& echo BLOCKED"),
        ("host loopback listener unreachable", "agent",
         _fails(f"timeout 3 bash -c 'echo x > /dev/tcp/127.0.0.1/{port}'")),
        ("no route beyond loopback", "agent",
         _fails("timeout 3 bash -c 'echo x > /dev/tcp/192.0.2.1/80'")),
        ("agent is uid 2000", "agent", "test $(id -u) = 2000 && echo BLOCKED"),
        ("agent has no capabilities", "agent", caps("hex($1) == 0")),
        ("no_new_privs and seccomp on", "agent",
         "grep -q '^NoNewPrivs:.1' /proc/self/status && grep -q '^Seccomp:.2' /proc/self/status "
         "&& echo BLOCKED"),
        ("root lacks SYS_ADMIN/NET_ADMIN/PTRACE/MODULE/NET_RAW/SYS_TIME/MKNOD", "root",
         caps(f"(hex($1) & {dangerous}) == 0")),
        ("task files unreadable by the agent", "agent", _fails(f"ls {TASK_ROOT}")),
        ("agent environment read-only (root)", "root", _fails(f"touch {AGENT_ENV}/x")),
        ("/proc/sys write (root)", "root", _fails("sh -c 'echo 1 > /proc/sys/vm/drop_caches'")),
        ("/proc/sysrq-trigger write (root)", "root", _fails("sh -c 'echo h > /proc/sysrq-trigger'")),
        ("/sys write (root)", "root", _fails("sh -c 'echo 1 > /sys/kernel/profiling'")),
        ("/proc/kcore masked (root)", "root",
         "test \"$(head -c 16 /proc/kcore 2>/dev/null | wc -c)\" = 0 && echo BLOCKED"),
        ("cgroup escape: moves and new cgroups (root)", "root", cgroup),
        ("cgroup limit raised (root)", "root",
         _fails("sh -c 'echo max > /sys/fs/cgroup/pids/pids.max'")),
        ("mount tmpfs (root)", "root", _fails("mount -t tmpfs none /mnt")),
        ("mount syscall (root)", "root", _sys(165, "none", "/mnt", "tmpfs", 0, 0)),
        ("user namespace (agent)", "agent", _fails("unshare -U -r true")),
        ("mount namespace (root)", "root", _fails("unshare -m true")),
        ("setns into init's netns (root)", "root", _fails("nsenter -t 1 -n true")),
        ("ptrace attach init (agent)", "agent", _sys(101, 16, 1, 0, 0, ok=("EPERM", "ESRCH"))),
        ("/proc/1/root of init (agent)", "agent", _fails("ls /proc/1/root/")),
        ("host pids invisible", "agent",
         "test $(ls /proc | grep -cE '^[0-9]+$') -le 12 && echo BLOCKED"),
        ("kill init (agent)", "agent", _fails("kill -9 1")),
        ("keyring add_key", "agent", _sys(248, "user", "k", "v", 1, -2)),
        ("keyring keyctl", "agent", _sys(250, 0, -1, 0)),
        ("bpf (root)", "root", _sys(321, 0, 0, 0)),
        ("perf_event_open", "agent", _sys(298, 0, 0, -1, -1, 0, ok=("EPERM", "EACCES"))),
        ("open_by_handle_at (root)", "root", _sys(304, 0, 0, 0)),
        ("init_module (root)", "root", _sys(175, 0, 0, "")),
        ("kexec_load (root)", "root", _sys(246, 0, 0, 0, 0)),
        ("reboot (root)", "root", _sys(169, 0xfee1dead, 672274793, 0x1234567)),
        ("raw packet socket (root)", "root", _sys(41, 17, 3, 768, ok=("EPERM", "EACCES"))),
        ("raw ICMP socket (root)", "root", _sys(41, 2, 3, 1, ok=("EPERM", "EACCES"))),
        ("mknod block device (root)", "root", _fails("mknod /tmp/sda b 8 0")),
        ("no block devices in /dev", "agent",
         "test $(find /dev -type b 2>/dev/null | wc -l) = 0 && echo BLOCKED"),
        ("set clock (root)", "root", _fails("date -s @0")),
        ("set hostname (agent)", "agent", _fails("hostname evil")),
        ("chroot breakout (root)", "root",
         "perl -e 'mkdir \"/tmp/x\"; chroot \"/tmp/x\"; chdir \"..\" for 1..64; chroot \".\"; "
         f"print((-e \"{secret}\") ? \"ESCAPED\" : \"BLOCKED\")'"),
        ("setuid binary made by root, run by the agent", "agent",
         "test \"$(/tmp/suid-id -u)\" = 2000 && echo BLOCKED"),
    ]


def _spec(image: str, memory: int = 256 << 20, pids: int = 128):
    from camg.sandboxes.containers import ContainerSpec
    from environments.general.demo.images import COMMAND
    return ContainerSpec(image=image, command=COMMAND, cpu=0.5, memory_bytes=memory,
                         pids_max=pids, mount_agent_env=True)


def _pids_events(cid: str) -> tuple[int, str]:
    """The container's pids cgroup, read on the host (dockerd's cgroupfs
    driver: <pids>/docker/<id>; dockerd may sit in another pid namespace,
    so not through its State.Pid): (max events, limit)."""
    candidates = [*Path("/sys/fs/cgroup/pids/docker").glob(cid + "*"),
                  *Path("/sys/fs/cgroup/docker").glob(cid + "*"),
                  *Path("/sys/fs/cgroup/pids/system.slice").glob(f"docker-{cid}*.scope")]
    for base in candidates:
        if (base / "pids.events").exists():
            events = (base / "pids.events").read_text().split()
            return int(events[1]) if len(events) == 2 else 0, (base / "pids.max").read_text().strip()
    return 0, "not found"


class _PidsWatch:
    """The most fork refusals a container's pids cgroup has counted, read on
    the host every 50 ms until ``stop`` (and once more then)."""

    def __init__(self, cid: str) -> None:
        self.cid, self.hits, self.limit = cid, 0, "not found"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            hits, limit = _pids_events(self.cid)
        except OSError:  # dockerd removed the cgroup between finding and reading it
            return
        if limit != "not found":
            self.hits, self.limit = max(self.hits, hits), limit

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            self._read()

    def stop(self) -> tuple[int, str]:
        self._done.set()
        self._thread.join()
        self._read()
        return self.hits, self.limit


def _running(cid: str) -> bool:
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", cid],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() == "true"


def run(helper: Helper, image: str) -> tuple[Row, list[tuple[str, bool | None, str]]]:
    from camg.sandboxes.containers import ContainerClient
    secret = helper.base / f"host-secret-{secrets.token_hex(4)}"
    secret.write_text(f"CAMG-HOST-SECRET-{secrets.token_hex(8)}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    cc = ContainerClient(helper.socket, owner="escape")
    results: list[tuple[str, bool | None, str]] = []
    made: list[str] = []

    def new(**kw) -> str:
        made.append(cc.create(_spec(image, **kw), episode_id=f"escape-{len(made)}").id)
        return made[-1]

    try:
        cid = new()
        cc.exec(cid, "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id", user="root")
        for name, user, command in probes(secret, helper.socket, port):
            r = cc.exec(cid, command, user=user, timeout=30)
            out = r.output.strip()
            results.append((name, out.endswith("BLOCKED"), out[-160:]))
        results += _resources(cc, helper, new)
        results.append(listener_unreached(listener))
        results.append(("helper alive after the battery", helper.alive(), ""))
    finally:
        for c in made:
            cc.remove(c)
        cc.close()
        listener.close()
        secret.unlink()
    probed = [r for r in results if r[1] is not None]
    blocked = sum(bool(ok) for _, ok, _ in probed)
    gaps = [n for n, ok, _ in results if ok is None]
    row = Row("escape", "general", f"{len(probed)} probes from inside a General agent container "
              "(Docker)", f"{blocked}/{len(probed)} blocked"
              + "".join(f"; NOT BLOCKED: {n}" for n, ok, _ in probed if not ok)
              + "".join(f"; known gap: {n}" for n in gaps), blocked == len(probed))
    return row, results


def _resources(cc, helper: Helper, new) -> list[tuple[str, bool | None, str]]:
    out = []
    sid = new()
    before = helper.rss_kib()
    r = cc.exec(sid, "yes", timeout=3, output_limit=4096)
    grown = helper.rss_kib() - before
    out.append(("output flood", r.truncated and r.timed_out and grown < 32 << 10,
                f"helper RSS +{grown} KiB"))
    bomb = new(pids=64)
    # The caller stays (sleep): the bomb meets pids.max while it runs. Its
    # cgroup is read while it runs too, not only after: the container may
    # exit (its transport could not start a thread) and dockerd remove the
    # cgroup before a read after the exec (the rehearsal at 9af988d, under
    # three lanes' load, found no cgroup and counted the probe not blocked).
    seen = _PidsWatch(bomb)
    cc.exec(bomb, "bash -c 'b(){ b|b& }; b'; sleep 4", timeout=8)
    hits, limit = seen.stop()
    # Bounded: the limit refused forks and the helper serves; the container
    # itself may be gone (its transport could not start a thread either).
    out.append(("fork bomb (pids limit)", hits > 0 and helper.alive(),
                f"pids.max {limit} refused {hits} forks; container "
                f"{'running' if _running(bomb) else 'exited'}; helper serving"))
    hog = new(memory=128 << 20)
    r = cc.exec(hog, "head -c 2000000000 /dev/zero | tail > /dev/null", timeout=60)
    alive = cc.exec(hog, "echo alive", timeout=30).output.strip()
    out.append(("memory hog (128 MiB limit)", r.exit_code != 0 and alive.endswith("alive"),
                f"exit {r.exit_code}; then {alive[-10:]}"))
    # Every writable path: / and /tmp are the overlay's upper, its own
    # bounded ext4 (helper/container_disk.py: the rig sizes it below
    # FILL_MIB); /dev/shm is a 64 MiB tmpfs of 4096 inodes
    # (helper/container_config.py shm_bytes/shm_inodes).
    for name, user, path in (("disk exhaustion through /tmp (agent)", "agent", "/tmp/fill"),
                             ("disk exhaustion through / (root)", "root", "/fill"),
                             ("disk exhaustion through /dev/shm (agent)", "agent", "/dev/shm/fill")):
        r = cc.exec(sid, f"dd if=/dev/zero of={path} bs=1M count={FILL_MIB} 2>&1; "
                    f"rm -f {path}", user=user, timeout=300)
        full = "No space left" in r.output
        out.append((name, full, "ENOSPC" if full else r.output.strip()[-120:]))
    # Empty files cost inodes only.
    r = cc.exec(sid, f"mkdir /tmp/many && cd /tmp/many && i=0; while [ $i -lt {INODE_CAP} ]; do "
                "true > f$i 2>/dev/null || { echo stopped at $i; break; }; i=$((i+1)); done; "
                "cd / && rm -rf /tmp/many", user="agent", timeout=300)
    out.append(("inode exhaustion through /tmp (agent)", "stopped at" in r.output,
                r.output.strip()[-120:] or f"{INODE_CAP} files made"))
    r = cc.exec(sid, f"cd /dev/shm && i=0; while [ $i -lt {INODE_CAP} ]; do "
                "true > f$i 2>/dev/null || { echo stopped at $i; break; }; i=$((i+1)); done; "
                "rm -f /dev/shm/f*", user="agent", timeout=300)
    made = r.output.split("stopped at")[-1].split()[0] if "stopped at" in r.output else ""
    out.append(("inode exhaustion through /dev/shm (agent)",
                made.isdigit() and int(made) < 4096, r.output.strip()[-120:] or f"{INODE_CAP} files made"))
    return out
