"""Docker containers for environment services, through the helper's mediator.

The service never holds the Docker socket: every operation is a helper verb
(helper/containers.py), checked against the allowed-images manifest, the
project's labels and the configured ceilings (helper/containers.py holds the verbs' parameters).

    cc = ContainerClient("/run/camg/helper.sock", owner="general")
    spec = ContainerSpec(image="127.0.0.1:5000/camg/x@sha256:...", command=("python3", "-m", "t"),
                         cpu=1.0, memory_bytes=2 << 30, pids_max=512)
    pool = ContainerPool(cc, spec, size=4)
    c = pool.claim("episode-1")
    sock = cc.connect(c.id, ENDPOINT)      # a socket connected to c's endpoint socket
    sock = cc.connect(c.id, 8000)          # a socket connected to 127.0.0.1:8000 inside c
    ...
    cc.remove(c.id)

Containers have no network: ``connect`` is how a service reaches a server
inside one (the helper connects inside the container and passes the socket
over). ``ENDPOINT`` is the container's endpoint socket, a Unix socket in a
directory only root may search (the General transport's), which the helper
reaches as root: a server there is out of reach of the container's
unprivileged users, where one on a TCP port of the container's loopback is
open to every uid in it. Errors are camg.errors classes, as for
HelperClient; SandboxDied means the container is gone or exited.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Literal

from camg import errors
from camg import helper_wire as wire
from camg.helper_client import DEFAULT_SOCKET, ExecResult, HelperClient, error_from_reply

log = logging.getLogger("camg.containers")

#: ContainerConnect's port naming the container's endpoint socket (helper/containers.py)
ENDPOINT = 0


_CREATE = wire.ContainerCreateParams


@dataclasses.dataclass(frozen=True)
class ContainerSpec:
    """What every container of one kind is created with (a pool's key): the
    ContainerCreate parameters (camg.helper_wire) but the episode's own."""

    image: str  # REPO@sha256:HEX, listed in the helper's allowed-images manifest
    cpu: float
    memory_bytes: int
    pids_max: int
    command: tuple[str, ...] = _CREATE.command  # exec form; empty: the image's CMD
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str = _CREATE.workdir
    user: Literal["", "agent", "root"] = _CREATE.user
    mount_agent_env: bool = _CREATE.mount_agent_env

    def create_params(
        self, *, episode_id: str = "", pool: bool = False
    ) -> wire.ContainerCreateParams:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return wire.ContainerCreateParams(**fields, episode_id=episode_id, pool=pool)

    def params(self) -> dict:
        """The JSON of a ContainerCreate of this spec (tests build refusals on it)."""
        return wire.to_json(self.create_params())


@dataclasses.dataclass(frozen=True)
class Container:
    id: str
    image: str
    episode_id: str
    pool: bool
    instance: str = ""  # the helper process that made it ("" from an older helper)


class ContainerClient:
    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        owner: str = "default",
        helper: HelperClient | None = None,
    ) -> None:
        self.helper = helper or HelperClient(socket_path, owner=owner)

    def pull(self, image: str) -> str:
        """Make a manifest image present locally; its image id."""
        return self.helper.call("ContainerPull", wire.ContainerPullParams(image))[0]["image_id"]

    def create(self, spec: ContainerSpec, *, episode_id: str = "", pool: bool = False) -> Container:
        r = self.helper.call(
            "ContainerCreate", spec.create_params(episode_id=episode_id, pool=pool)
        )[0]
        return Container(
            r["container_id"], r["image"], episode_id, pool, str(r.get("instance") or "")
        )

    def fork(
        self,
        container_id: str,
        *,
        episode_id: str = "",
        allow_agent_processes: bool = wire.ContainerForkParams.allow_agent_processes,
    ) -> Container:
        """A new container of this peer from a snapshot of ``container_id``
        as it stands (helper/container_fork.py): same parameters, its own
        main process started afresh. NotForkable (``what`` agent_processes
        or fork_depth) for what the helper refuses to carry."""
        try:
            r = self.fork_reply(
                container_id, episode_id=episode_id, allow_agent_processes=allow_agent_processes
            )
        except (errors.PermissionDenied, errors.BadRequest) as exc:
            refusals: dict[object, str] = {
                "not_allowed": "agent_processes",
                "limit_exceeded": "fork_depth",
            }
            what = refusals.get(exc.details.get("helper_error"))
            if what is None:
                raise
            raise errors.NotForkable(
                f"the container cannot be forked: {exc.message}", what=what
            ) from None
        return Container(
            r["container_id"], r["image"], episode_id, False, str(r.get("instance") or "")
        )

    def fork_reply(
        self,
        container_id: str,
        *,
        episode_id: str = "",
        allow_agent_processes: bool = wire.ContainerForkParams.allow_agent_processes,
    ) -> dict:
        """ContainerFork's whole reply (depth, standby, snapshot and the
        timings: the benchmarks)."""
        p = wire.ContainerForkParams(container_id, episode_id, allow_agent_processes)
        return self.helper.call("ContainerFork", p)[0]

    def helper_instance(self) -> str:
        """The running helper process's id ("" from an older helper): one
        that differs from a container's was started after that container's
        maker died, and its start-up sweep removed the container."""
        return str(self.helper.call("Ping", wire.NoParams())[0].get("instance") or "")

    def create_raw(self, params: dict) -> dict:
        """ContainerCreate with exactly these parameters (tests of the refusals)."""
        return self.helper.call("ContainerCreate", params)[0]

    def connect(self, container_id: str, port: int, *, timeout: float = 10.0) -> socket.socket:
        """A socket connected to 127.0.0.1:port inside the container, or to
        its endpoint socket for ``ENDPOINT``.

        Retries while nothing listens yet (the server inside is starting),
        until ``timeout``; then Unavailable. SandboxDied if the container is gone.
        """
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                return self._connect_once(
                    container_id, port, min(5.0, max(0.1, deadline - time.monotonic()))
                )
            except errors.Unavailable as exc:
                if (
                    exc.details.get("helper_error") != "connection_refused"
                    or time.monotonic() >= deadline
                ):
                    raise
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    def _connect_once(self, container_id: str, port: int, timeout: float) -> socket.socket:
        h = self.helper
        sock = h._connect()
        try:
            sock.sendall(
                wire.encode(
                    h.request(
                        "ContainerConnect", wire.ContainerConnectParams(container_id, port, timeout)
                    )
                )
            )
            reply, _, fd = wire.read_frame_with_fd(sock, 1 << 20)
        except (OSError, EOFError, wire.FrameError) as exc:
            raise errors.Unavailable(
                f"helper connection failed during ContainerConnect: {exc}"
            ) from None
        finally:
            sock.close()
        if reply.get("ok") is not True:
            if fd >= 0:
                os.close(fd)
            raise error_from_reply(reply)
        if fd < 0:
            raise errors.InfraFailure("helper: ContainerConnect answered without a descriptor")
        return socket.socket(fileno=fd)

    def exec(
        self,
        container_id: str,
        command: str,
        *,
        user: Literal["agent", "root"] = wire.ExecOptions.user,
        cwd: str = wire.ExecOptions.cwd,
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float = wire.ExecOptions.timeout,
        output_limit: int = wire.ExecOptions.output_limit,
    ) -> ExecResult:
        p = wire.ContainerExecParams(
            container_id,
            command,
            user=user,
            cwd=cwd,
            env=dict(env or {}),
            timeout=timeout,
            output_limit=output_limit,
        )
        return ExecResult.from_reply(self.helper.call("ContainerExec", p, stdin)[0])

    def put_archive(self, container_id: str, dest_dir: str, tar_bytes: bytes) -> None:
        self.helper.call(
            "ContainerPutArchive", wire.ContainerPutArchiveParams(container_id, dest_dir), tar_bytes
        )

    def get_archive(self, container_id: str, path: str) -> bytes:
        return self.helper.call(
            "ContainerGetArchive", wire.ContainerGetArchiveParams(container_id, path)
        )[1]

    def logs(
        self, container_id: str, *, tail_bytes: int = wire.ContainerLogsParams.tail_bytes
    ) -> str:
        p = wire.ContainerLogsParams(container_id, tail_bytes)
        return self.helper.call("ContainerLogs", p)[0]["logs"]

    def remove(self, container_id: str) -> bool:
        """Idempotent: False when the container was already gone."""
        return self.helper.call("ContainerRemove", wire.ContainerParams(container_id))[0]["removed"]

    def usage(self, container_id: str) -> dict:
        """cpu_s, memory_peak_bytes, disk_written_bytes of one of this peer's containers."""
        return self.helper.call("ContainerUsage", wire.ContainerParams(container_id))[0]

    def reap(self, container_id: str) -> dict:
        """Kill every agent-uid process of the container from outside (the
        helper freezes it, kills, thaws; nothing forks inside it): what a
        grade runs before it collects anything -> killed, duration."""
        return self.helper.call("ContainerReap", wire.ContainerParams(container_id))[0]

    def list(self) -> list[dict]:
        return self.helper.call("ContainerList", wire.NoParams())[0]["containers"]

    def release_all(self) -> int:
        return self.helper.call("ContainerReleaseAll", wire.NoParams())[0]["released"]

    def close(self) -> None:
        self.helper.close()


class ContainerPool:
    """A bounded set of started, never-used containers of one spec, refilled in the background.

    ``claim`` hands one out (or, when the pool is empty, creates one on the
    spot: a miss, counted). Pool containers carry the label camg.pool=1 and
    no episode id (labels are fixed at creation): the service records which
    episode claimed which container. Unclaimed ones are removed by
    ``close``, and by the helper's release and sweeps like any other.
    """

    def __init__(
        self,
        client: ContainerClient,
        spec: ContainerSpec,
        size: int,
        *,
        refill_threads: int = 1,
        retry_delay: float = 1.0,
    ) -> None:
        if size < 0 or refill_threads < 1:
            raise ValueError("size >= 0 and refill_threads >= 1")
        self.client = client
        self.spec = spec
        self.size = size
        self.retry_delay = retry_delay
        self.ready: collections.deque[Container] = collections.deque()
        self.cond = threading.Condition()
        self.inflight = 0
        self.closed = False
        self.hits = 0
        self.misses = 0
        self.swept = 0  # ready containers a restarted helper had removed
        self.last_error: Exception | None = None
        self.threads = [
            threading.Thread(target=self._refill, name=f"container-pool-{i}", daemon=True)
            for i in range(refill_threads)
        ]
        for t in self.threads:
            t.start()

    def _refill(self) -> None:
        while True:
            with self.cond:
                while not self.closed and len(self.ready) + self.inflight >= self.size:
                    self.cond.wait()
                if self.closed:
                    return
                self.inflight += 1
            container = None
            try:
                container = self.client.create(self.spec, pool=True)
                self.last_error = None
            except errors.CamgError as exc:
                self.last_error = exc
                log.warning("container pool refill failed: %s", exc)
            with self.cond:
                self.inflight -= 1
                if container is not None and not self.closed:
                    self.ready.append(container)
                    self.cond.notify_all()
                    continue
                if container is None and not self.closed:
                    self.cond.wait(self.retry_delay)  # back off before the next try
            if container is not None:  # closed meanwhile
                self._remove(container)

    def claim(self, episode_id: str = "") -> Container:
        return self.take(episode_id) or self.create(episode_id)

    def take(self, episode_id: str = "") -> Container | None:
        """A ready container (a hit), or None when the pool is empty."""
        self._drop_swept()
        with self.cond:
            container = self.ready.popleft() if self.ready else None
            self.cond.notify_all()
        if container is None:
            return None
        self.hits += 1
        return dataclasses.replace(container, episode_id=episode_id)

    def create(self, episode_id: str = "") -> Container:
        """A new container for ``episode_id`` (a miss)."""
        self.misses += 1
        return self.client.create(self.spec, episode_id=episode_id)

    def _drop_swept(self) -> None:
        """Forget the ready containers a restarted helper has swept (the
        helper was killed since they were made): handing one out would
        fail the episode's reset. One Ping per claim: one more helper round
        trip beside the several a reset makes anyway (not measured apart)."""
        with self.cond:
            if not self.ready:
                return
        try:
            current = self.client.helper_instance()
        except errors.CamgError:
            return  # the claim's own call will say what is wrong
        if not current:
            return
        with self.cond:
            kept = collections.deque(c for c in self.ready if c.instance in ("", current))
            dropped = len(self.ready) - len(kept)
            self.ready = kept
            if dropped:
                self.swept += dropped
                self.cond.notify_all()  # refill
        if dropped:
            log.warning(
                "container pool: %d ready container(s) were swept by a restarted helper; dropped",
                dropped,
            )

    def wait_full(self, timeout: float) -> bool:
        """Block until the pool holds ``size`` containers (tests, warm-up)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.ready) < self.size:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return False
                self.cond.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        for t in self.threads:
            t.join(timeout=60)
        with self.cond:
            left, self.ready = list(self.ready), collections.deque()
        for container in left:
            self._remove(container)

    def _remove(self, container: Container) -> None:
        try:
            self.client.remove(container.id)
        except errors.CamgError as exc:  # the helper's release/sweep takes it
            log.warning("removing pool container %s failed: %s", container.id[:12], exc)


def read_usage(client: ContainerClient | None, container_id: str) -> dict | None:
    """A container's usage for its episode's cost (camg.episodes.cost), read before
    it is removed; None when the helper cannot say (a lost measurement is
    logged and never costs the episode its grade)."""
    if client is None:
        return None
    try:
        return client.usage(container_id)
    except errors.CamgError as exc:
        log.warning("reading container %s usage failed: %s", container_id[:12], exc)
        return None
