"""Isolation probes: a real sandbox, attacked the way an agent would.

They run at start-up and on demand (the Probe verb). While any fails the
registry refuses CreateSandbox with probes_failed; there is no fallback.
Every probe checks an outcome observed from outside where it can (the host
lower, the cgroup counters, the netns seen through pyroute2), not only what
the sandbox says about itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from camg.helper_wire import CreateSandboxParams, WireError
from helper import proberoot
from helper.sandbox import Sandbox
from helper.sandbox_table import Peer, Registry

log = logging.getLogger("camg.helper")
_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000
# CapEff the sandbox's root may hold (sbxinit.c keep_caps): chown,
# dac_override, fowner, fsetid, kill, setgid, setuid, setpcap,
# net_bind_service, sys_chroot.
ROOT_CAPS = sum(1 << c for c in (0, 1, 3, 4, 5, 6, 7, 8, 10, 18))


class ProbeFailed(Exception):
    pass


class Probes:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.lock = threading.Lock()
        self.last: dict = {}

    def run(self) -> dict:
        with self.lock:
            result = self._run()
        failed = [r for r in result["results"] if not r["ok"]]
        self.registry.probe_failure = (
            None if not failed else "; ".join(f"{r['name']}: {r['detail']}" for r in failed)[:2000]
        )
        self.last = result
        self.registry.first_probes_done.set()
        return result

    def _run(self) -> dict:
        start = time.monotonic()
        cfg = self.registry.config
        try:
            lowers = tuple(cfg.probe_lowers) or (proberoot.ensure(cfg.state_dir),)
        except (OSError, subprocess.SubprocessError) as exc:
            return {
                "ok": False,
                "duration": 0.0,
                "results": [
                    {
                        "name": "probe_root",
                        "ok": False,
                        "detail": f"cannot build the probe root: {exc}",
                    }
                ],
            }
        peer = Peer(0, 0, os.getpid(), "camg-probes")
        spec = CreateSandboxParams(
            lowers, memory_bytes=64 << 20, cpu_quota=1.0, pids_max=64, hostname="camg-probe"
        )
        try:
            sandbox = self.registry.create(peer, spec, probe=True)
        except (WireError, OSError) as exc:
            return {
                "ok": False,
                "duration": time.monotonic() - start,
                "results": [{"name": "create", "ok": False, "detail": str(exc)}],
            }
        results = []
        try:
            for name, probe in PROBES:
                try:
                    probe(self, sandbox)
                    results.append({"name": name, "ok": True, "detail": ""})
                except (ProbeFailed, WireError, OSError) as exc:
                    results.append({"name": name, "ok": False, "detail": str(exc)[:500]})
        finally:
            self.registry.destroy(sandbox)
        ok = all(r["ok"] for r in results)
        if not ok:
            log.error("isolation probes failed: %s", [r for r in results if not r["ok"]])
        return {"ok": ok, "duration": round(time.monotonic() - start, 3), "results": results}

    def sh(self, sandbox: Sandbox, command: str, user: str = "agent", timeout: float = 10.0):
        cfg = self.registry.config
        uid, gid = (cfg.agent_uid, cfg.agent_gid) if user == "agent" else (0, 0)
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/",
            "LANG": "C",
        }
        r = sandbox.run(
            ["/bin/bash", "-c", command],
            uid=uid,
            gid=gid,
            cwd="/",
            env=env,
            stdin=b"",
            timeout=timeout,
            output_limit=65536,
        )
        return r.exit_code, r.output.decode(errors="replace"), r


def _expect(cond: bool, detail: str) -> None:
    if not cond:
        raise ProbeFailed(detail)


def _status(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)


def agent_identity(p: Probes, sb: Sandbox) -> None:
    cfg = p.registry.config
    code, out, _ = p.sh(
        sb,
        'echo "ids: $(id -u) $(id -G)"; grep -E "^(CapEff|CapPrm|NoNewPrivs):" /proc/self/status',
    )
    st = _status(out)
    _expect(code == 0, f"exit {code}: {out}")
    _expect(st.get("ids:") == f"{cfg.agent_uid} {cfg.agent_gid}", f"identity {st.get('ids:')!r}")
    _expect(
        int(st.get("CapEff:", "1"), 16) == 0 and int(st.get("CapPrm:", "1"), 16) == 0,
        f"capabilities {st.get('CapEff:')}",
    )
    _expect(st.get("NoNewPrivs:") == "1", "no_new_privs is not set")
    code, out, _ = p.sh(sb, "echo x > /dev/null && echo x > /dev/shm/probe")
    _expect(code == 0, f"the agent cannot use /dev/null or /dev/shm: {out}")


def root_capabilities(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(sb, 'grep -E "^(CapEff|CapBnd|NoNewPrivs):" /proc/self/status', user="root")
    st = _status(out)
    for key in ("CapEff:", "CapBnd:"):
        caps = int(st.get(key, "f" * 16), 16)
        _expect(caps & ~ROOT_CAPS == 0, f"sandbox root {key} {caps:#x} exceeds {ROOT_CAPS:#x}")
    _expect(st.get("NoNewPrivs:") == "1", "no_new_privs is not set for the sandbox root")


def mount_denied(p: Probes, sb: Sandbox) -> None:
    for user in ("agent", "root"):
        code, out, _ = p.sh(sb, "mount -t tmpfs camg-probe /mnt 2>&1 || exit 42", user=user)
        _expect(code == 42, f"mount(2) as {user} did not fail: {out}")


def kernel_surface_filtered(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(sb, "grep '^Seccomp:' /proc/self/status")
    _expect(out.split()[1:2] == ["2"], f"no seccomp filter: {out.strip()}")
    for user in ("agent", "root"):
        code, out, _ = p.sh(sb, "unshare -U true 2>/dev/null && exit 0 || exit 42", user=user)
        _expect(code == 42, f"{user} can create a user namespace")
        code, out, _ = p.sh(sb, "unshare -n true 2>/dev/null && exit 0 || exit 42", user=user)
        _expect(code == 42, f"{user} can create a network namespace")


def pid_namespace(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(sb, 'for d in /proc/[0-9]*; do echo "${d#/proc/}"; done')
    pids = {int(x) for x in out.split() if x.isdigit()}
    _expect(
        1 in pids and len(pids) <= 4 and max(pids) < 64, f"/proc shows pids {sorted(pids)[:20]}"
    )
    _expect(os.getpid() not in pids or os.getpid() < 64, "the helper's pid is visible")


def loopback_only(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(sb, "ls /sys/class/net")
    _expect(out.split() == ["lo"], f"/sys/class/net lists {out.split()}")
    links = _links_in_netns(sb.init_pid)
    _expect([name for name, _ in links] == ["lo"], f"netns links {links}")
    _expect(links[0][1] == "up", "lo is not up")


def _links_in_netns(pid: int) -> list[tuple[str, str]]:
    """Links of the sandbox's netns, read with pyroute2 from a thread that
    joined it (a network namespace is per thread, so the helper is unmoved)."""
    out: list = []

    def inside() -> None:
        from pyroute2 import IPRoute

        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if _libc.setns(target, _CLONE_NEWNET) != 0:
                out.append(OSError(ctypes.get_errno(), "setns"))
                return
            try:
                with IPRoute() as ipr:
                    for link in ipr.get_links():
                        out.append(
                            (
                                link.get_attr("IFLA_IFNAME"),
                                link.get_attr("IFLA_OPERSTATE")
                                and ("up" if link["flags"] & 1 else "down"),
                            )
                        )
            finally:
                _libc.setns(own, _CLONE_NEWNET)
        except Exception as exc:
            out.append(exc)
        finally:
            os.close(own)
            os.close(target)

    t = threading.Thread(target=inside)
    t.start()
    t.join(30)
    errors = [x for x in out if isinstance(x, Exception)]
    if errors:
        raise ProbeFailed(f"cannot list links: {errors[0]}")
    return out


def host_invisible(p: Probes, sb: Sandbox) -> None:
    marker = os.path.join(p.registry.config.state_dir, f"probe-marker-{secrets.token_hex(6)}")
    with open(marker, "w") as f:
        f.write("host")
    try:
        code, out, _ = p.sh(
            sb, f"test -e {marker} || test -e {p.registry.config.socket} || exit 42", user="root"
        )
        _expect(code == 42, "a host file or the helper socket is visible inside")
    finally:
        os.unlink(marker)


def lowers_readonly(p: Probes, sb: Sandbox) -> None:
    name = f"camg-probe-{secrets.token_hex(6)}"
    code, out, _ = p.sh(
        sb, f"echo x > /{name} && echo x >> /etc/hostname && rm -rf /usr/share/doc", user="root"
    )
    _expect(code == 0, f"writing the sandbox's root failed: {out}")
    for lower in sb.record.lowers:
        _expect(not os.path.exists(os.path.join(lower, name)), f"a write reached lower {lower}")
    bottom = sb.record.lowers[0]
    _expect(
        not os.path.isdir(os.path.join(bottom, "usr/share"))
        or os.path.isdir(os.path.join(bottom, "usr/share/doc")),
        "a delete reached the lower",
    )


def memory_oom(p: Probes, sb: Sandbox) -> None:
    before = _oom_kills(sb)
    code, out, _ = p.sh(sb, "a=x; while :; do a=$a$a; done", timeout=30)
    _expect(code == 137, f"memory hog ended with {code}: {out[-200:]}")
    _expect(_oom_kills(sb) > before, "the memory cgroup recorded no OOM kill")


def _oom_kills(sb: Sandbox) -> int:
    with open(os.path.join(sb.record.cgroups["memory"], "memory.oom_control")) as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return 0


def fork_bomb(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(
        sb, "b() { b | b & }; b; for i in $(seq 100); do sleep 5 & done; wait", timeout=3
    )
    with open(os.path.join(sb.record.cgroups["pids"], "pids.events")) as f:
        hits = int(f.read().split()[1])
    _expect(hits > 0, "pids.max was never hit")
    code, out, _ = p.sh(sb, "echo alive")
    _expect(code == 0 and out.strip() == "alive", f"sandbox unusable after the bomb: {code} {out}")


def timeout_kills_tree(p: Probes, sb: Sandbox) -> None:
    code, out, r = p.sh(sb, "setsid sleep 1000 & disown; (sleep 1000 &); sleep 1000", timeout=1)
    _expect(r.timed_out and code == 124, f"timeout gave exit {code}")
    _expect(not _live_named(p, sb, "sleep"), "a disowned sleep survived the timeout")


def _live_named(p: Probes, sb: Sandbox, name: str) -> list[str]:
    """Processes called ``name`` in the sandbox that are not zombies."""
    code, out, _ = p.sh(
        sb,
        "for f in /proc/[0-9]*/status; do "
        "grep -E '^(Name|State):' $f 2>/dev/null | tr '\\n' ' '; echo; done",
    )
    return [
        line for line in out.splitlines() if line.split()[1:2] == [name] and "(zombie)" not in line
    ]


def sockets_unreachable(p: Probes, sb: Sandbox) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code, out, _ = p.sh(
            sb, f"exec 3<>/dev/tcp/127.0.0.1/{port} && exit 0 || exit 42", timeout=5
        )
        _expect(code == 42, "a host loopback socket is reachable")
    finally:
        listener.close()


def kernel_interfaces_readonly(p: Probes, sb: Sandbox) -> None:
    # Opening for write (no byte written) is enough: a read-only mount
    # refuses the open itself.
    for target in ("/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/sys/kernel/uevent_helper"):
        code, out, _ = p.sh(sb, f": >> {target} 2>/dev/null && exit 0 || exit 42", user="root")
        _expect(code == 42, f"{target} is writable by the sandbox's root")
    code, out, _ = p.sh(sb, "touch /sys/camg-probe 2>/dev/null && exit 0 || exit 42", user="root")
    _expect(code == 42, "/sys is writable")


def setuid_gains_nothing(p: Probes, sb: Sandbox) -> None:
    code, out, _ = p.sh(
        sb,
        "cp /usr/bin/id /tmp/camg-suid && chmod 4755 /tmp/camg-suid 2>&1 || exit 42",
        user="root",
    )
    if code == 42 and "not permitted" in out:
        return  # a seccomp filter above us (RestrictSUIDSGID=) forbids even setting the bit
    _expect(code == 0, f"preparing a setuid binary failed: {out}")
    code, out, _ = p.sh(sb, "/tmp/camg-suid -u")
    _expect(
        out.strip() == str(p.registry.config.agent_uid),
        f"setuid binary ran with euid {out.strip()}",
    )


PROBES: list[tuple[str, Callable[[Probes, Sandbox], None]]] = [
    ("agent_identity", agent_identity),
    ("root_capabilities", root_capabilities),
    ("mount_denied", mount_denied),
    ("kernel_surface_filtered", kernel_surface_filtered),
    ("pid_namespace", pid_namespace),
    ("loopback_only", loopback_only),
    ("host_invisible", host_invisible),
    ("lowers_readonly", lowers_readonly),
    ("kernel_interfaces_readonly", kernel_interfaces_readonly),
    ("setuid_gains_nothing", setuid_gains_nothing),
    ("sockets_unreachable", sockets_unreachable),
    ("timeout_kills_tree", timeout_kills_tree),
    ("fork_bomb", fork_bomb),
    ("memory_oom", memory_oom),
]
