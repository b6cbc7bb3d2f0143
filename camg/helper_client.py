"""The client the unprivileged daemons use to reach camg-helper.

    from camg.helper_client import HelperClient
    helper = HelperClient("/run/camg/helper.sock", owner="coding")
    sid = helper.create_sandbox([image_rootfs, task_layer], memory_bytes=2 << 30,
                                cpu_quota=1.0, pids_max=512)
    result = helper.exec(sid, "cd /testbed && git status", cwd="/testbed")
    helper.destroy(sid)

Lowers are given **bottom-first**: ``lowers[0]`` is the base (the image
rootfs) and each later directory lies on top of the ones before it (task
layers). The sandbox's root is their overlay with a private upper, so files
of a lower owned by uid 2000 are writable by the agent via copy-up.

Thread safety: a client keeps a small pool of connections; each call takes
one for its duration, so one client may be shared by many threads and calls
run concurrently (a second exec on the *same* sandbox waits for the first).

Errors are camg.errors classes chosen by the helper's closed error names
(``camg.helper_wire.ERRORS``): BadRequest (bad_request, unknown_verb,
path_escape, limit_exceeded), PayloadTooLarge, NotFound, AtCapacity,
Unavailable (probes_failed, helper unreachable), PermissionDenied,
SandboxDied (the sandbox's init was killed from outside: end the episode
with failure_class sandbox_died) and InfraFailure (anything else). The
helper's name is in ``exc.details["helper_error"]``.

Requests are built from the wire's typed parameters (camg.helper_wire.PARAMS),
so every default here is the helper's; ``call`` with a plain dict sends it
as it is (tests of the helper's refusals, fuzzers).

``python -m camg.helper_client release-all --owner NAME`` releases a
daemon's sandboxes (for a unit's ExecStopPost=).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Literal

from camg import errors
from camg import helper_wire as wire

DEFAULT_SOCKET = "/run/camg/helper.sock"


@dataclasses.dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str
    truncated: bool
    timed_out: bool
    duration: float

    @classmethod
    def from_reply(cls, r: dict) -> ExecResult:
        return cls(r["exit_code"], r["output"], r["truncated"], r["timed_out"], r["duration"])


# Each closed helper error name -> the camg.errors class it resembles.
ERROR_CLASSES: dict[str, type[errors.CamgError]] = {
    "bad_request": errors.BadRequest,
    "unknown_verb": errors.BadRequest,
    "path_escape": errors.BadRequest,
    "limit_exceeded": errors.BadRequest,
    "payload_too_large": errors.PayloadTooLarge,
    "permission_denied": errors.PermissionDenied,
    "not_found": errors.NotFound,
    "at_capacity": errors.AtCapacity,
    "probes_failed": errors.Unavailable,
    "sandbox_died": errors.SandboxDied,
    "internal": errors.InfraFailure,
    "not_allowed": errors.PermissionDenied,
    "docker_unavailable": errors.Unavailable,
    "connection_refused": errors.Unavailable,
}
assert set(ERROR_CLASSES) == wire.ERRORS, "every helper error name maps to one class"


def error_from_reply(reply: dict) -> errors.CamgError:
    name = reply.get("error")
    message = str(reply.get("message", ""))
    cls = (
        ERROR_CLASSES.get(name, errors.InfraFailure)
        if isinstance(name, str)
        else errors.InfraFailure
    )
    return cls(f"helper: {message}", helper_error=name)


class HelperClient:
    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        owner: str = "default",
        connect_timeout: float = 5.0,
        max_blob: int = 1 << 30,
        pool_size: int = 8,
    ) -> None:
        self.socket_path = socket_path
        self.owner = owner
        self.connect_timeout = connect_timeout
        self.max_blob = max_blob
        self.pool_size = pool_size
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    # -- transport --------------------------------------------------------

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(self.socket_path)
                break
            except BlockingIOError:
                # EAGAIN: the listen backlog is full (a burst of resets);
                # the helper is there and accepting, so wait our turn.
                sock.close()
                if time.monotonic() >= deadline:
                    raise errors.Unavailable(
                        f"helper at {self.socket_path} stayed busy for {self.connect_timeout:g} s"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except OSError as exc:
                sock.close()
                raise errors.Unavailable(
                    f"helper unreachable at {self.socket_path}: {exc}"
                ) from None
        # Replies may take as long as the command's own deadline.
        sock.settimeout(None)
        return sock

    def request(self, verb: str, params: object = None) -> dict:
        """The JSON part of a request: typed params (a wire.PARAMS type) built
        by the wire, a dict or None sent as it is."""
        if params is None or isinstance(params, dict):
            name = verb if verb.startswith(wire.PREFIX) else wire.PREFIX + verb
            return {"verb": name, "params": params or {}, "owner": self.owner}
        return wire.request(verb, params, self.owner)

    def call(self, verb: str, params: object = None, blob: bytes = b"") -> tuple[dict, bytes]:
        """One request; returns (result, blob) or raises the mapped camg error."""
        obj = self.request(verb, params)
        name = obj["verb"]
        frame = wire.encode(obj, blob)
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        reused = sock is not None
        if sock is None:
            sock = self._connect()
        try:
            reply, out = self._exchange(sock, frame)
        except (OSError, EOFError, wire.FrameError) as exc:
            sock.close()
            if reused and isinstance(exc, (BrokenPipeError, ConnectionResetError, EOFError)):
                # A pooled connection the helper closed (it restarted): retry
                # once on a fresh one. Requests are not replayed otherwise.
                return self._fresh_call(frame)
            raise errors.Unavailable(f"helper connection failed during {name}: {exc}") from None
        self._release(sock)
        return self._unwrap(reply, out)

    def _fresh_call(self, frame: bytes) -> tuple[dict, bytes]:
        sock = self._connect()
        try:
            reply, out = self._exchange(sock, frame)
        except (OSError, EOFError, wire.FrameError) as exc:
            sock.close()
            raise errors.Unavailable(f"helper connection failed: {exc}") from None
        self._release(sock)
        return self._unwrap(reply, out)

    def _exchange(self, sock: socket.socket, frame: bytes) -> tuple[dict, bytes]:
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the helper may have answered (permission_denied) and hung up first
        return wire.read_frame(sock, self.max_blob)

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size:
                self._idle.append(sock)
                return
        sock.close()

    @staticmethod
    def _unwrap(reply: dict, out: bytes) -> tuple[dict, bytes]:
        if reply.get("ok") is True and isinstance(reply.get("result"), dict):
            return reply["result"], out
        raise error_from_reply(reply)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def __enter__(self) -> HelperClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- verbs ------------------------------------------------------------

    def ping(self) -> dict:
        return self.call("Ping", wire.NoParams())[0]

    def probe(self) -> dict:
        return self.call("Probe", wire.NoParams())[0]

    def create_sandbox(
        self,
        lowers: list[str],
        *,
        memory_bytes: int,
        cpu_quota: float,
        pids_max: int,
        hostname: str = wire.CreateSandboxParams.hostname,
        upper: Literal["tmpfs", "disk"] = wire.CreateSandboxParams.upper,
        upper_bytes: int = wire.CreateSandboxParams.upper_bytes,
    ) -> str:
        p = wire.CreateSandboxParams(
            tuple(lowers), memory_bytes, cpu_quota, pids_max, hostname, upper, upper_bytes
        )
        return self.call("CreateSandbox", p)[0]["sandbox_id"]

    def exec(
        self,
        sandbox_id: str,
        command: str,
        *,
        user: Literal["agent", "root"] = wire.ExecOptions.user,
        cwd: str = wire.ExecOptions.cwd,
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float = wire.ExecOptions.timeout,
        output_limit: int = wire.ExecOptions.output_limit,
    ) -> ExecResult:
        p = wire.ExecParams(
            sandbox_id,
            command,
            user=user,
            cwd=cwd,
            env=dict(env or {}),
            timeout=timeout,
            output_limit=output_limit,
        )
        return ExecResult.from_reply(self.call("Exec", p, stdin)[0])

    def put_archive(
        self,
        sandbox_id: str,
        dest_dir: str,
        tar_bytes: bytes,
        *,
        user: Literal["agent", "root"] = wire.PutArchiveParams.user,
    ) -> None:
        self.call("PutArchive", wire.PutArchiveParams(sandbox_id, dest_dir, user), tar_bytes)

    def get_archive(self, sandbox_id: str, path: str) -> bytes:
        return self.call("GetArchive", wire.GetArchiveParams(sandbox_id, path))[1]

    def destroy(self, sandbox_id: str) -> bool:
        """Idempotent: False when the sandbox was already gone."""
        return self.call("DestroySandbox", wire.SandboxParams(sandbox_id))[0]["destroyed"]

    def sandbox_usage(self, sandbox_id: str) -> dict:
        """cpu_s, memory_peak_bytes, disk_written_bytes (and pids_peak where
        the kernel keeps it) of one of this peer's sandboxes."""
        return self.call("SandboxUsage", wire.SandboxParams(sandbox_id))[0]

    def fork_sandbox(self, sandbox_id: str) -> dict:
        """A new sandbox over this one's filesystem as it stands ->
        sandbox_id, depth, upper_bytes (helper/forks.py)."""
        return self.call("ForkSandbox", wire.ForkSandboxParams(sandbox_id))[0]

    def kill_commands(self, sandbox_id: str) -> int:
        """Kill every process of the sandbox but its init, from outside (the
        freezer cgroup), and wait until they are gone -> how many were
        killed. Needs no free pid in the sandbox."""
        return self.call("KillCommands", wire.SandboxParams(sandbox_id))[0]["killed"]

    def release_all(self) -> int:
        return self.call("ReleaseAll", wire.NoParams())[0]["released"]

    def list_sandboxes(self) -> list[dict]:
        return self.call("ListSandboxes", wire.NoParams())[0]["sandboxes"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m camg.helper_client")
    ap.add_argument("action", choices=["release-all", "ping", "probe"])
    ap.add_argument("--socket", default=DEFAULT_SOCKET)
    ap.add_argument("--owner", default="default")
    args = ap.parse_args(argv)
    client = HelperClient(args.socket, owner=args.owner)
    try:
        if args.action == "release-all":
            print(client.release_all())
        elif args.action == "ping":
            print(client.ping())
        else:
            result = client.probe()
            print(result)
            return 0 if result.get("ok") else 1
    except errors.Unavailable as exc:
        # Nothing to release when the helper is down: its own sweep reclaims.
        print(exc, file=sys.stderr)
        return 0 if args.action == "release-all" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
