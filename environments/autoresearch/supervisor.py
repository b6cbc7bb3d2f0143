"""The service's side of the private grader: start it, talk to it, watch it.

The grader is a child process under its own uid. Per start the service
makes a socketpair (the only channel; no name anywhere a sandbox could
reach) and a fresh 32-byte random credential, handed over through the
child's stdin pipe and then forgotten by the pipe — never written to disk,
never put in an environment or a command line. The child's environment is
a fixed minimal one. When the grader exits for any reason the watcher calls
``on_exit``; the environment then stops the whole service (systemd restarts
both), and any grading in flight ends with ``grader_error``.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping

from camg import errors
from environments.autoresearch import gradewire

log = logging.getLogger("camg.autoresearch")
_HELLO_TIMEOUT = 120.0


def drop_setid_capabilities() -> None:
    """The unit grants CAP_SETUID/CAP_SETGID only to start the grader as its
    own uid; once it runs they leave the effective, permitted, inheritable
    and ambient sets for good (not root in tests). Capabilities are per
    thread: this runs in the process's only thread (Environment.
    start_in_only_thread), so every thread created later starts without
    them. Without CAP_SETPCAP the bounding set cannot shrink; that is no
    gap: nothing can put a capability back into the permitted set
    (NoNewPrivileges, no file capabilities)."""
    if os.geteuid() == 0:
        return
    try:
        import prctl
    except ImportError:
        return
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        log.error("dropping CAP_SETUID/CAP_SETGID with %d threads: the others keep them", threads)
    trim_bounding = bool(getattr(prctl.cap_effective, "setpcap", False))
    for cap in ("setuid", "setgid"):
        try:
            setattr(prctl.cap_effective, cap, False)
            setattr(prctl.cap_permitted, cap, False)
            setattr(prctl.cap_inheritable, cap, False)
            if trim_bounding:
                prctl.capbset.drop(getattr(prctl, f"CAP_{cap.upper()}"))
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("could not drop CAP_%s: %s", cap.upper(), exc)
        if getattr(prctl.cap_permitted, cap, False):
            log.error("CAP_%s is still permitted after the drop", cap.upper())


class Grader:
    def __init__(
        self,
        *,
        private_root: str,
        tasks: list[str],
        user: str,
        expected_answers: Mapping[str, str],
        python: str = sys.executable,
        timeout: float = 120.0,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.private_root = private_root
        self.tasks = list(tasks)
        self.user = user
        self.expected_answers = dict(expected_answers)
        self.python = python
        self.timeout = timeout
        self.on_exit = on_exit
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._credential = b""
        self._seq = 0
        self._lock = threading.Lock()
        self._stopping = False
        self.exit_status: int | None = None
        self.uid: int | None = None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> None:
        try:
            account = pwd.getpwnam(self.user)
        except KeyError:
            raise errors.ConfigError(
                f"grader user {self.user!r} does not exist (sysusers.d "
                "camg.conf creates camg-grader)"
            ) from None
        if account.pw_uid == os.getuid() or account.pw_uid == 0:
            raise errors.ConfigError(
                f"grader user {self.user!r} must be its own unprivileged "
                "uid, not the service's or root's"
            )
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        child_fd = theirs.fileno()
        self._credential = secrets.token_bytes(gradewire.CREDENTIAL_BYTES)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        try:
            # user=/group= need CAP_SETUID/CAP_SETGID: root in tests; the unit
            # grants them to the service, which drops them right after.
            self.proc = subprocess.Popen(
                [self.python, "-m", "environments.autoresearch.grader"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd="/",
                user=account.pw_uid,
                group=account.pw_gid,
                extra_groups=[],
                umask=0o077,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            mine.close()
            theirs.close()
            raise errors.ConfigError(f"cannot start the grader as {self.user}: {exc}") from None
        finally:
            drop_setid_capabilities()
        theirs.close()
        self.uid = account.pw_uid
        self.sock = mine
        setup = {
            "credential": self._credential.hex(),
            "fd": child_fd,
            "private_root": self.private_root,
            "tasks": self.tasks,
        }
        stdin = self.proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        try:
            stdin.write(json.dumps(setup).encode())
            stdin.close()
        except OSError as exc:
            self.stop()
            raise errors.ConfigError(f"the grader died at start: {exc}") from None
        del setup
        self._hello()
        threading.Thread(target=self._watch, name="grader-watch", daemon=True).start()
        log.info("grader started as %s (uid %d, pid %d)", self.user, account.pw_uid, self.proc.pid)

    def _hello(self) -> None:
        sock = self.sock
        assert sock is not None  # start() set it just before
        sock.settimeout(_HELLO_TIMEOUT)
        try:
            hello, _ = gradewire.receive(sock, self._credential, gradewire.FROM_GRADER, 0)
        except (OSError, EOFError, gradewire.Tampered, ValueError) as exc:
            self.stop()
            raise errors.ConfigError(f"the grader did not start: {exc}") from None
        if not hello.get("hello"):
            self.stop()
            raise errors.ConfigError(
                f"the grader cannot load the private answers: {hello.get('error')}"
            )
        if hello.get("uid") != self.uid:
            self.stop()
            raise errors.ConfigError(f"the grader runs as uid {hello.get('uid')}, not {self.uid}")
        if hello.get("answers") != self.expected_answers:
            self.stop()
            raise errors.ConfigError(
                "the private answers differ from the prepared manifest "
                "(re-run camg.prepare --environment autoresearch)"
            )

    def _watch(self) -> None:
        proc = self.proc
        assert proc is not None  # watched only once it is spawned
        status = proc.wait()
        self.exit_status = status
        if not self._stopping:
            log.critical("the private grader (pid %d) exited with status %s", proc.pid, status)
            if self.on_exit is not None:
                self.on_exit(status)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self) -> None:
        """Idempotent: closing our end makes the grader exit."""
        self._stopping = True
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()  # root only; otherwise the unit's stop takes it
                proc.wait(5)
        self._credential = b""

    # -- requests ---------------------------------------------------------

    def grade(self, task_id: str, submission: bytes) -> dict:
        with self._lock:
            sock = self.sock
            if sock is None or not self.alive:
                raise errors.GraderError("the private grader is not running")
            self._seq += 1
            try:
                sock.settimeout(self.timeout)
                gradewire.send(
                    sock,
                    self._credential,
                    gradewire.TO_GRADER,
                    self._seq,
                    {"task_id": task_id},
                    submission,
                )
                reply, _ = gradewire.receive(
                    sock, self._credential, gradewire.FROM_GRADER, self._seq
                )
            except TimeoutError:
                raise errors.GraderError(
                    f"the grader did not answer within {self.timeout:g} s"
                ) from None
            except (OSError, EOFError, gradewire.Tampered, ValueError) as exc:
                raise errors.GraderError(f"grader connection failed: {exc}") from None
        if not reply.get("ok"):
            raise errors.GraderError(f"the grader failed: {reply.get('error')}")
        return reply
