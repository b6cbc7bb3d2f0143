"""One sandbox: its init process, cgroups, upper and ledger record.

The init (sbxinit.c) is spawned with posix_spawn, joins the sandbox's
cgroups, unshares mount/pid/net/uts/ipc namespaces and forks pid 1, which
builds the root and then forks commands on request. The helper talks to it
over a SOCK_SEQPACKET socketpair and hands it the pipe ends of each command
(SCM_RIGHTS), so all command I/O is done here, bounded, and init stays tiny.

The helper is a child subreaper: pid 1 of every sandbox is its child, so
the pid cannot be reused before destroy() reaps it.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass

from camg.helper_wire import CreateSandboxParams, WireError
from helper import cgroups
from helper.ledger import Ledger, Record, remove_upper

_EXEC_HEADER = struct.Struct("=cIIIIII")
_STATUS = struct.Struct("=cIi")
# How long an exec waits for init to report the exit of a command it has
# already killed (freeze, kill, thaw) before declaring the sandbox dead.
_KILL_GRACE = 10.0


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    output: bytes  # the final bytes of the interleaved (or stderr) stream
    total: int  # how many bytes that stream carried in all
    timed_out: bool
    duration: float
    stdout: bytes = b""  # captured in full (capture mode only)


class Sandbox:
    def __init__(self, record: Record, init_pid: int, ctl: socket.socket) -> None:
        self.record = record
        self.id = record.sandbox_id
        self.init_pid = init_pid
        self.ctl = ctl
        self.ops = threading.Lock()  # one command at a time
        self.state = threading.Lock()
        self.destroyed = False
        self.died = False
        self.reqid = 0
        # What a fork repeats (set by the registry): the create's checked
        # parameters, the upper's size, and the frozen layers this sandbox
        # stacks over its lowers (helper/forks.py), bottom-first.
        self.spec: CreateSandboxParams | None = None  # None: a probe sandbox
        self.size = 0
        self.layers: tuple = ()

    # -- creation ---------------------------------------------------------

    @classmethod
    def spawn(
        cls,
        record: Record,
        *,
        init_binary: str,
        hostname: str,
        scratch: str,
        lowers: list[str],
        tmpfs_bytes: int,
        shm: tuple[int, int],
        timeout: float,
        layer_fds: tuple[int, ...] = (),
    ) -> Sandbox:
        """Start init for ``record`` (cgroups and upper exist already).

        ``shm`` is /dev/shm's (size, nr_inodes): Ceilings.shm of the spec.

        ``layer_fds`` become init's descriptors 5.. (a fork's frozen layers,
        named in ``lowers`` as /proc/self/fd/N/...)."""
        # overlayfs lists lowers top-first; our API takes them bottom-first.
        lowerdir = ":".join(reversed(lowers))
        upper = record.upper_dir or "tmpfs"
        procs = [os.path.join(record.cgroups[c], "cgroup.procs") for c in sorted(record.cgroups)]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [
            init_binary,
            hostname,
            scratch,
            lowerdir,
            upper,
            str(tmpfs_bytes),
            *(str(n) for n in shm),
            *procs,
        ]
        # Above every target (3, 5..), so no dup2 of the spawn overwrites a
        # source it has yet to copy.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in layer_fds]
        try:
            spawner = os.posix_spawn(
                init_binary,
                argv,
                {},
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
                    *((os.POSIX_SPAWN_DUP2, fd, 5 + i) for i, fd in enumerate(high)),
                ],
            )
        finally:
            theirs.close()
            for fd in high:
                os.close(fd)
        init_pid = 0
        try:
            ours.settimeout(timeout)
            # The spawner's 'P' (init's host pid) and init's 'R' come from two
            # processes, so either may arrive first; both are required.
            ready = False
            while not (init_pid and ready):
                msg = _recv(ours)
                if msg[:1] == b"P" and len(msg) == 5:
                    init_pid = struct.unpack("=I", msg[1:5])[0]
                elif msg[:1] == b"R":
                    ready = True
                else:
                    detail = msg[1:].decode(errors="replace") if msg[:1] == b"F" else "init exited"
                    raise WireError("internal", f"sandbox setup failed: {detail}")
            if init_pid <= 1:
                raise WireError("internal", f"sandbox init reported pid {init_pid}")
        except BaseException as exc:
            if init_pid > 1:
                _kill_and_reap(init_pid)
            ours.close()
            if isinstance(exc, socket.timeout):
                raise WireError("internal", "sandbox setup timed out") from None
            raise
        finally:
            os.waitpid(spawner, 0)
        ours.settimeout(None)
        return cls(record, init_pid, ours)

    def upper_handle(self) -> int:
        """A descriptor of init's read-only clone of the mount holding this
        sandbox's upper (sbxinit's fd 4); the caller holds ``ops``."""
        try:
            self.ctl.sendall(b"U")
            deadline = time.monotonic() + _KILL_GRACE
            while time.monotonic() < deadline:
                self.ctl.settimeout(max(0.01, deadline - time.monotonic()))
                msg, fds, _flags, _addr = socket.recv_fds(self.ctl, 4096, 1)
                if msg == b"U" and fds:
                    return fds[0]
                for fd in fds:
                    os.close(fd)
                if not msg:
                    break
                if msg[:1] == b"E" and len(msg) >= _STATUS.size:
                    raise WireError(
                        "internal",
                        "init could not hand over its upper: "
                        f"{os.strerror(_STATUS.unpack(msg[: _STATUS.size])[2])}",
                    )
                # anything else is a late report of an earlier request
        except OSError:
            pass
        finally:
            try:
                self.ctl.settimeout(None)
            except OSError:
                pass  # closed under us by destroy
        self._mark_died()
        raise WireError("sandbox_died", f"sandbox {self.id}: init did not hand over its upper")

    # -- commands ---------------------------------------------------------

    def run(
        self,
        argv: list[str],
        *,
        uid: int,
        gid: int,
        cwd: str,
        env: dict[str, str],
        stdin: bytes,
        timeout: float,
        output_limit: int,
        capture_limit: int = 0,
    ) -> RunResult:
        """Run ``argv`` in the sandbox; stdout+stderr interleaved unless capturing.

        With ``capture_limit`` stdout is collected whole (up to that many
        bytes) and ``output`` is the tail of stderr.
        """
        with self.ops:
            if self.destroyed or self.died:
                raise WireError(
                    "sandbox_died" if self.died else "not_found",
                    f"sandbox {self.id} is {'dead' if self.died else 'destroyed'}",
                )
            self.reqid += 1
            return self._run(
                self.reqid, argv, uid, gid, cwd, env, stdin, timeout, output_limit, capture_limit
            )

    def _run(self, rid, argv, uid, gid, cwd, env, stdin, timeout, output_limit, capture_limit):
        start = time.monotonic()
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC) if capture_limit else (-1, out_w)
        cwd_b = cwd.encode() + b"\0"
        argv_b = b"".join(a.encode() + b"\0" for a in argv)
        env_b = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        head = _EXEC_HEADER.pack(b"E", rid, uid, gid, len(cwd_b), len(argv_b), len(env_b))
        fds = array.array("i", [in_r, out_w, err_w])
        try:
            self.ctl.sendmsg(
                [head + cwd_b + argv_b + env_b], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
            )
        except OSError:
            for fd in {in_r, in_w, out_r, out_w, err_r, err_w} - {-1}:
                os.close(fd)
            self._mark_died()
            raise WireError("sandbox_died", f"sandbox {self.id}: init is gone") from None
        for fd in {in_r, out_w, err_w}:
            os.close(fd)
        streams = _Streams(out_r, err_r, in_w, stdin, output_limit, capture_limit)
        try:
            status, timed_out = self._wait(rid, streams, start + timeout)
        finally:
            streams.close()
        if streams.capture_overflow:
            raise WireError("payload_too_large", f"output exceeds {capture_limit} bytes")
        if timed_out:
            code = 124
        elif os.WIFSIGNALED(status):
            code = 128 + os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
        tail, total = streams.tail()
        return RunResult(
            code, tail, total, timed_out, time.monotonic() - start, bytes(streams.captured)
        )

    def _wait(self, rid: int, streams: _Streams, deadline: float) -> tuple[int, bool]:
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        streams.register(poller)
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    self._mark_died()
                    raise WireError(
                        "sandbox_died", f"sandbox {self.id}: a killed command never exited"
                    )
                timed_out = True
                self.kill_commands()
                deadline = time.monotonic() + _KILL_GRACE
                continue
            for fd, ev in poller.poll(left * 1000):
                if fd != self.ctl.fileno():
                    streams.ready(poller, fd, ev)
                    if streams.capture_overflow and not timed_out:
                        timed_out = True  # stop it now; reported as too large
                        self.kill_commands()
                    continue
                msg = _recv(self.ctl)
                if not msg:
                    self._mark_died()
                    raise WireError("sandbox_died", f"sandbox {self.id}: its init died")
                kind, got, value = _STATUS.unpack(msg[: _STATUS.size])
                if got != rid:
                    continue  # a late report of an earlier request
                if kind == b"E":
                    raise WireError(
                        "internal", f"init could not start the command: {os.strerror(value)}"
                    )
                if kind == b"X":
                    streams.drain()
                    if timed_out:
                        self._await_only_init()
                    return value, timed_out

    def _await_only_init(self, limit: float = 2.0) -> None:
        # The killed tree is gone from the cgroup before the reply says
        # "timed out", so a next command never sees its remains.
        freezer = self.record.cgroups["freezer"]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if all(p == self.init_pid for p in cgroups.procs(freezer)):
                return
            time.sleep(0.002)

    def kill_commands(self) -> int:
        """Every process of the sandbox but init: frozen, killed, thawed."""
        return cgroups.kill_all(self.record.cgroups["freezer"], spare=self.init_pid)

    def kill_all_but_init(self, limit: float = _KILL_GRACE) -> int:
        """KillCommands: every process but init killed from outside (the
        freezer), and gone from the cgroup before this returns, so the pids
        they held are free for the next command. Done from here, never by a
        command in the sandbox: a sandbox whose pids limit the agent filled
        cannot start one. Returns how many were killed; idempotent."""
        freezer = self.record.cgroups["freezer"]
        killed = 0
        deadline = time.monotonic() + limit
        while True:
            # Again while any is left: a process mid-fork when the first
            # freeze landed can leave a child the first member list lacked.
            killed += self.kill_commands()
            wait_until = min(deadline, time.monotonic() + 0.5)
            while time.monotonic() < wait_until:
                if all(p == self.init_pid for p in cgroups.procs(freezer)):
                    return killed
                time.sleep(0.002)
            if time.monotonic() >= deadline:
                left = [p for p in cgroups.procs(freezer) if p != self.init_pid]
                raise WireError(
                    "internal", f"sandbox {self.id}: {len(left)} process(es) survived the kill"
                )

    def _mark_died(self) -> None:
        self.died = True

    def alive(self) -> bool:
        if self.died or self.destroyed:
            return False
        try:
            # Still our unreaped child; a zombie means init died.
            with open(f"/proc/{self.init_pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                self.died = True
        except FileNotFoundError:
            self.died = True
        return not self.died

    # -- teardown ---------------------------------------------------------

    def destroy(self, ledger: Ledger) -> bool:
        """Kill everything, remove cgroups, upper and record; False if already done."""
        with self.state:
            if self.destroyed:
                return False
            self.destroyed = True
        # pid 1 dying makes the kernel kill the whole pid namespace; its mount
        # and net namespaces (tmpfs upper, overlay, /proc, lo) go with it.
        # 0: a fork killed init and could not start its successor.
        pid = self.init_pid
        if pid > 1:
            _kill_and_reap(pid)
        with self.ops:  # a running exec sees EOF and leaves
            # A fork that held ops meanwhile may have started a new init.
            if self.init_pid > 1 and self.init_pid != pid:
                _kill_and_reap(self.init_pid)
            self.ctl.close()
        cgroups.remove(self.record.cgroups)
        remove_upper(self.record.upper_dir)
        ledger.remove(self.id)
        # A layer's last user closes it (a disk one's filesystem goes with it).
        layers, self.layers = self.layers, ()
        for layer in layers:
            layer.release()
        return True


class _Streams:
    """Bounded collection of a command's output and feeding of its stdin."""

    def __init__(
        self, out_r: int, err_r: int, in_w: int, stdin: bytes, output_limit: int, capture_limit: int
    ) -> None:
        self.out_r, self.err_r, self.in_w = out_r, err_r, in_w
        self.pending = memoryview(stdin)
        self.limit = output_limit
        self.capture_limit = capture_limit
        self.ring = bytearray()
        self.total = 0
        self.captured = bytearray()
        self.capture_overflow = False
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.set_blocking(fd, False)
        if not stdin:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.in_w >= 0:
            os.close(self.in_w)
            self.in_w = -1

    def register(self, poller) -> None:
        poller.register(self.out_r, select.POLLIN)
        if self.err_r >= 0:
            poller.register(self.err_r, select.POLLIN)
        if self.in_w >= 0:
            poller.register(self.in_w, select.POLLOUT)

    def _take(self, fd: int, data: bytes) -> None:
        if fd == self.out_r and self.capture_limit:
            if len(self.captured) + len(data) > self.capture_limit:
                self.capture_overflow = True
            else:
                self.captured += data
            return
        self.total += len(data)
        self.ring += data
        # Trimmed by length, never by a negative index (ring[:-0] is empty,
        # which would keep everything): the ring stays under 2*limit + 64 KiB.
        if len(self.ring) > 2 * self.limit + 65536:
            del self.ring[: len(self.ring) - self.limit]

    def ready(self, poller, fd: int, ev: int) -> None:
        if fd == self.in_w:
            try:
                n = os.write(fd, self.pending[:65536])
                self.pending = self.pending[n:]
            except BlockingIOError:
                return
            except BrokenPipeError:
                self.pending = self.pending[:0]
            if not self.pending:
                poller.unregister(fd)
                self._close_stdin()
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data:
            self._take(fd, data)
        else:
            poller.unregister(fd)

    def drain(self) -> None:
        # The command has exited and its process group is dead: what is in
        # the pipe now is all we wait for. Bounded, because a setsid() daemon
        # still holding (and writing) the pipe must not keep the reply waiting.
        for fd in (self.out_r, self.err_r):
            for _ in range(64 if fd >= 0 else 0):
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._take(fd, data)

    def tail(self) -> tuple[bytes, int]:
        return bytes(
            self.ring[max(0, len(self.ring) - self.limit) :]
        ) if self.limit > 0 else b"", self.total

    def close(self) -> None:
        self._close_stdin()
        for fd in (self.out_r, self.err_r):
            if fd >= 0:
                os.close(fd)
        self.out_r = self.err_r = -1


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except ConnectionResetError:
        return b""  # the peer died with our message unread: the same as EOF


def _kill_and_reap(pid: int) -> None:
    if pid <= 1:
        # kill(0) or kill(-1) would hit the helper's own group or everyone.
        raise ValueError(f"refusing to kill pid {pid}")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # exited, not yet reaped: the wait below reaps it
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped
