"""The container mediator: Docker through the helper's closed verbs.

Docker access is root-equivalent, so environment daemons never hold the
Docker socket; they ask the helper, which runs only manifest images pinned
by digest, with the project's labels, bounded resources, ``--init``, no
network (each container has only its own loopback), no privilege, no added
capability, no device and no host path but the configured agent
environment (read-only). Every other request is refused by a closed error
name before Docker is called. A container belongs to the peer (uid + owner
label) that created it; another peer's container is reported as missing.

The service reaches a server inside a container (the transport) with
ContainerConnect and hands the connected socket over (SCM_RIGHTS). Port 0
(``ENDPOINT``) is the container's endpoint socket: a Unix socket at the
fixed ``ENDPOINT_SOCKET``, in a directory only root may search, which the
helper reaches as root in a throwaway thread that enters the container's
mount namespace; the General transport listens there and nowhere else, so
the agent's uid in the same container cannot reach it. Any other port is
127.0.0.1:PORT, connected from a thread in the container's network
namespace. No bridge, no container IP: a container cannot reach the host or
another container, and the service's unit stays loopback-only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable

from camg.helper_wire import ContainerCreateParams, WireError
from helper import commands
from helper import container_ops as ops
from helper.config import Ceilings
from helper.container_config import ContainerConfig
from helper.container_gate import Gate
from helper.container_standby import Standby

log = logging.getLogger("camg.helper")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,254}@sha256:[0-9a-f]{64}$")
_ID = re.compile(r"^[0-9a-f]{64}$")
_EPISODE = re.compile(r"^[A-Za-z0-9._:-]{0,128}$")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_CLONE_FS = 0x00000200
#: ContainerConnect's port that names the endpoint socket (no TCP port is 0)
ENDPOINT = 0
#: the endpoint socket's path inside a container (mimoagent.transport.listener.SOCKET_PATH)
ENDPOINT_SOCKET = "/run/mimo-transport/transport.sock"
_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass
class Held:
    """A container this helper instance created and still holds."""

    id: str
    uid: int
    owner: str
    image: str
    episode_id: str
    pool: bool
    created_at: float
    pidfd: int
    # What it was created with (a fork's child is created with the same).
    params: ContainerCreateParams | None = None
    # A fork's child: the snapshot image it runs (removed when its last
    # container goes: helper/container_fork.py) and how many forks deep it is.
    snapshot: str = ""
    depth: int = 0


# -- the mediator -----------------------------------------------------------------


class Mediator:
    def __init__(
        self, cfg: ContainerConfig, *, agent_uid: int, agent_gid: int, ceilings: Ceilings
    ) -> None:
        self.cfg = cfg
        self.agent = f"{agent_uid}:{agent_gid}"
        # The helper's ceilings (helper/config.py), the same a sandbox is held to.
        self.ceilings = ceilings
        # A fresh id per helper instance: the start-up sweep removed every
        # container of this scope, so all that carry it were made by us.
        self.boot = secrets.token_hex(8)
        self.docker = ops.Docker(cfg)
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}
        # snapshot image -> the snapshot its parent ran ("" for a manifest image)
        self.lineage: dict[str, str] = {}
        self._manifest: tuple[float, frozenset[str]] = (-1.0, frozenset())
        # Containers being created or started at once, this create (run or
        # fork) and the standby refills alike; Ping reports it.
        self.starts = Gate(cfg.concurrent_starts)
        # Created, bounded, not started children for forks (helper/container_standby.py).
        self.standby = Standby(self)

    # -- admission --------------------------------------------------------

    def allowed_images(self) -> frozenset[str]:
        path = self.cfg.images_manifest
        try:
            mtime = os.stat(path).st_mtime
            if mtime == self._manifest[0]:
                return self._manifest[1]
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            images = data["images"] if isinstance(data, dict) else None
            if not isinstance(images, list) or not all(
                isinstance(i, str) and _IMAGE.match(i) for i in images
            ):
                raise ValueError('expected {"images": ["REPO@sha256:HEX", ...]}')
        except (OSError, ValueError, KeyError) as exc:
            raise WireError(
                "not_allowed", f"no image is allowed: manifest {path} unreadable: {exc}"
            ) from None
        self._manifest = (mtime, frozenset(images))
        return self._manifest[1]

    def check_image(self, image: str) -> str:
        if not isinstance(image, str) or not _IMAGE.match(image):
            raise WireError(
                "not_allowed", "image: must be a digest-pinned reference REPO@sha256:HEX"
            )
        if image not in self.allowed_images():
            raise WireError(
                "not_allowed", f"image {image[:200]!r} is not in the allowed-images manifest"
            )
        return image

    def labels_for(self, peer, p: ContainerCreateParams) -> dict[str, str]:
        labels = {
            "camg.helper": self.cfg.scope,
            "camg.boot": self.boot,
            "camg.service": peer.owner,
            "camg.uid": str(peer.uid),
            "camg.episode": p.episode_id,
            "camg.pool": "1" if p.pool else "0",
        }
        for key, value in p.labels.items():
            if labels.get(key) != value:
                raise WireError(
                    "not_allowed",
                    f"label {key[:100]!r}: only the project's labels with "
                    "their true values may be set",
                )
        return labels

    def check_create(self, peer, p: ContainerCreateParams) -> dict:
        cfg = self.cfg
        if p.privileged:
            raise WireError("not_allowed", "privileged containers are not allowed")
        if p.cap_add:
            raise WireError("not_allowed", "adding capabilities is not allowed")
        if p.devices:
            raise WireError("not_allowed", "devices are not allowed")
        if p.binds:
            raise WireError(
                "not_allowed", "host bind mounts are not allowed (mount_agent_env is the only one)"
            )
        if p.network != "none":
            raise WireError(
                "not_allowed", "network: only 'none' (reach the container with ContainerConnect)"
            )
        if p.mount_agent_env and not cfg.agent_env_source:
            raise WireError("not_allowed", "mount_agent_env: no agent environment is configured")
        if not 0.01 <= p.cpu <= cfg.max_cpu:
            raise WireError("limit_exceeded", f"cpu: must be within [0.01, {cfg.max_cpu}]")
        if not 6 << 20 <= p.memory_bytes <= cfg.max_memory_bytes:
            raise WireError(
                "limit_exceeded", f"memory_bytes: must be within [6 MiB, {cfg.max_memory_bytes}]"
            )
        if not 8 <= p.pids_max <= cfg.max_pids:
            raise WireError("limit_exceeded", f"pids_max: must be within [8, {cfg.max_pids}]")
        if not _EPISODE.match(p.episode_id):
            raise WireError("bad_request", "episode_id: at most 128 of [A-Za-z0-9._:-]")
        limit = self.ceilings.command_bytes
        if any("\0" in a for a in p.command) or sum(len(a.encode()) for a in p.command) > limit:
            raise WireError("limit_exceeded", f"command: at most {limit} bytes without NUL")
        if p.workdir and not (
            p.workdir.startswith("/") and "\0" not in p.workdir and len(p.workdir) < 4096
        ):
            raise WireError("bad_request", "workdir: an absolute path")
        commands.check_env(p.env, self.ceilings)
        return self.labels_for(peer, p)

    def admit(self, peer) -> None:
        """Called with self.lock held."""
        if len(self.held) >= self.cfg.containers_total:
            raise WireError(
                "at_capacity", f"the helper holds {self.cfg.containers_total} containers already"
            )
        mine = sum(1 for h in self.held.values() if (h.uid, h.owner) == (peer.uid, peer.owner))
        if mine >= self.cfg.containers_per_peer:
            raise WireError(
                "at_capacity", f"this peer holds {self.cfg.containers_per_peer} containers already"
            )

    # -- lifecycle --------------------------------------------------------

    def create(self, peer, p: ContainerCreateParams) -> Held:
        image = self.check_image(p.image)
        return self.start(peer, p, self.check_create(peer, p), run_image=image)

    def run_spec(self, p: ContainerCreateParams) -> dict:
        """Docker.create's arguments for checked ``p`` (but name, image, labels)."""
        user = {"": "", "agent": self.agent, "root": "0:0"}[p.user]
        mounts = {}
        if p.mount_agent_env:
            mounts[self.cfg.agent_env_source] = {"bind": self.cfg.agent_env_target, "mode": "ro"}
        return dict(
            command=list(p.command),
            env=dict(p.env),
            workdir=p.workdir,
            user=user,
            cpu=p.cpu,
            memory=p.memory_bytes,
            pids=p.pids_max,
            binds=mounts,
        )

    def start_deadline(self) -> float:
        """Until when a create may wait for a start slot (time.monotonic())."""
        return time.monotonic() + self.cfg.start_wait_timeout

    def container_name(self, peer) -> str:
        return f"camg-{self.cfg.scope}-{peer.owner}-{secrets.token_hex(6)}"[:120]

    def start(
        self,
        peer,
        p: ContainerCreateParams,
        labels: dict[str, str],
        *,
        run_image: str = "",
        snapshot: str = "",
        depth: int = 0,
        launch: Callable[[str], tuple[str, int]] | None = None,
    ) -> Held:
        """Admit, then run ``run_image`` with checked ``p`` and ``labels``
        (p.image, the manifest image, is what the container is recorded as);
        or ``launch(name)`` -> (id, pid): a fork's own way to a running child."""
        token = secrets.token_hex(6)
        with self.lock:
            # (a waiter is admitted and counted: the ceilings hold for the queue too)
            self.admit(peer)
            self.held[token] = Held(
                token, peer.uid, peer.owner, p.image, p.episode_id, p.pool, 0.0, -1
            )
        try:
            # One slot from nothing to running: create, the layer's ext4, start.
            with self.starts.slot(self.start_deadline()):
                if launch is None:
                    cid, pid = self.docker.run(
                        name=self.container_name(peer),
                        image=run_image,
                        labels=labels,
                        **self.run_spec(p),
                    )
                else:
                    cid, pid = launch(self.container_name(peer))
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.docker.remove(cid)
                raise WireError(
                    "sandbox_died", "the container exited as soon as it started"
                ) from None
            held = Held(
                cid,
                peer.uid,
                peer.owner,
                p.image,
                p.episode_id,
                p.pool,
                time.time(),
                pidfd,
                p,
                snapshot,
                depth,
            )
            with self.lock:
                self.held[cid] = held
            return held
        finally:
            with self.lock:
                self.held.pop(token, None)

    def get(self, peer, container_id: str) -> Held:
        if not isinstance(container_id, str) or not _ID.match(container_id):
            raise WireError("bad_request", "container_id: the 64-hex id ContainerCreate returned")
        with self.lock:
            held = self.held.get(container_id)
        # Someone else's container is reported exactly like a missing one.
        if held is None or (held.uid, held.owner) != (peer.uid, peer.owner):
            raise WireError("not_found", f"no container {container_id[:12]} for this peer")
        return held

    def remove(self, held: Held) -> bool:
        gone = self.docker.remove(held.id)
        with self.lock:
            if self.held.pop(held.id, None) is not None and held.pidfd >= 0:
                os.close(held.pidfd)
        if held.snapshot:
            from helper import container_fork

            container_fork.release(self, held.snapshot)
        self.standby.drop_unused()
        return gone

    def mine(self, peer) -> list[Held]:
        with self.lock:
            return [
                h
                for h in self.held.values()
                if (h.uid, h.owner) == (peer.uid, peer.owner) and h.pidfd >= 0
            ]

    def release_all(self, peer) -> int:
        """Every container of this peer: those held, and any the labels name."""
        self.standby.drop_peer(peer)  # (not counted: the peer never had them)
        n = sum(self.remove(h) for h in self.mine(peer))
        n += self.docker.remove_labelled(
            {"camg.helper": self.cfg.scope, "camg.service": peer.owner, "camg.uid": str(peer.uid)}
        )
        from helper import container_fork

        container_fork.collect(self)
        return n

    def connect(self, held: Held, port: int, timeout: float) -> socket.socket:
        if isinstance(port, bool) or not 0 <= port <= 65535:
            raise WireError("bad_request", "port: 0 (the endpoint socket) or within [1, 65535]")
        if not 0 < timeout <= 60:
            raise WireError("limit_exceeded", "timeout: within (0, 60]")
        if ops.pid_exited(held.pidfd):
            raise WireError("sandbox_died", f"container {held.id[:12]} is not running")
        if port == ENDPOINT:
            return connect_endpoint(held.pidfd, timeout)
        return connect_in_netns(held.pidfd, port, timeout)


def _call(result: int) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _in_thread(
    name: str, enter: Callable[[], None], family: int, address, timeout: float
) -> socket.socket:
    """A socket of ``family`` connected to ``address`` from a throwaway
    thread that first runs ``enter`` (joining a namespace of the container).

    setns changes only the calling thread, and this thread ends right
    after: the helper's other threads never leave the host's namespaces. A
    socket keeps the namespace it was created in, and a Unix socket's peer
    is found when it connects."""
    out: dict = {}

    def run() -> None:
        try:
            enter()
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address)
                sock.settimeout(None)
            except BaseException:
                sock.close()
                raise
            out["sock"] = sock
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join()
    err = out.get("error")
    if err is not None:
        raise err
    return out["sock"]


def _mapped(err: OSError, what: str) -> WireError | OSError:
    # Nothing listens yet (the server inside is starting: no socket file,
    # or one a forked container's filesystem carried from its parent), or
    # its backlog is full (EAGAIN): the client retries until its deadline.
    if isinstance(
        err,
        (ConnectionRefusedError, FileNotFoundError, BlockingIOError, TimeoutError, socket.timeout),
    ):
        return WireError("connection_refused", f"nothing accepts on {what} in the container")
    if err.errno in (errno.ESRCH, errno.EINVAL):
        return WireError("sandbox_died", "the container's init is gone")
    return err


def connect_in_netns(pidfd: int, port: int, timeout: float) -> socket.socket:
    """A TCP socket connected to 127.0.0.1:port in the network namespace of pidfd's process."""
    try:
        return _in_thread(
            "netns-connect",
            lambda: _call(_libc.setns(pidfd, _CLONE_NEWNET)),
            socket.AF_INET,
            ("127.0.0.1", port),
            timeout,
        )
    except OSError as exc:
        raise _mapped(exc, f"127.0.0.1:{port}") from None


def connect_endpoint(pidfd: int, timeout: float, path: str = ENDPOINT_SOCKET) -> socket.socket:
    """A Unix socket connected, as root, to ``path`` in the mount namespace of pidfd's process.

    The path resolves as the container's processes see it (its root, its
    mounts, its symlinks), never against the host's. Joining a mount
    namespace needs a thread that shares no filesystem context with the
    others (unshare CLONE_FS first); the thread's root and cwd become the
    namespace's. The peer's credentials are this thread's: uid 0, which
    the transport requires (SO_PEERCRED)."""

    def enter() -> None:
        _call(_libc.unshare(_CLONE_FS))
        _call(_libc.setns(pidfd, _CLONE_NEWNS))

    try:
        return _in_thread("mntns-connect", enter, socket.AF_UNIX, path, timeout)
    except OSError as exc:
        raise _mapped(exc, path) from None


# -- process-wide instance and the sweep -----------------------------------------

_mediator: Mediator | None = None
_mediator_lock = threading.Lock()


def mediator(config) -> Mediator:
    """The helper's mediator, made on first use from its HelperConfig."""
    global _mediator
    if config.containers is None:
        raise WireError("docker_unavailable", "this helper has no containers configuration")
    with _mediator_lock:
        if _mediator is None:
            _mediator = Mediator(
                config.containers,
                agent_uid=config.agent_uid,
                agent_gid=config.agent_gid,
                ceilings=config.ceilings,
            )
        return _mediator


def start_status(config) -> dict[str, int]:
    """Ping's container_starts: creates/starts in flight and waiting, the
    limit (0: no containers section), the most in flight at once."""
    if config.containers is None:
        return {"limit": 0, "in_flight": 0, "waiting": 0, "peak": 0, "served": 0}
    with _mediator_lock:
        m = _mediator
    if m is None:  # no container verb yet: nothing started
        return {
            "limit": config.containers.concurrent_starts,
            "in_flight": 0,
            "waiting": 0,
            "peak": 0,
            "served": 0,
        }
    return m.starts.status()


def sweep(config, say: Callable[[str], None]) -> int:
    """Remove every container and network of this helper's scope (start-up, stop, --sweep).

    Containers of other scopes, and anything without the label, are never
    looked at. Docker being down is not an error here: there is nothing of
    ours running without it, and the next sweep tries again.
    """
    cfg: ContainerConfig | None = config.containers
    if cfg is None:
        return 0
    try:
        # A hung dockerd must not hold up the helper's start (or a unit's stop) for long.
        n = ops.Docker(cfg, timeout=min(10.0, cfg.api_timeout)).sweep_scope(cfg.scope)
    except WireError as exc:
        say(f"container sweep skipped: {exc.message}")
        return 0
    with _mediator_lock:
        if _mediator is not None:
            with _mediator.lock:
                for held in _mediator.held.values():
                    if held.pidfd >= 0:
                        os.close(held.pidfd)
                _mediator.held.clear()
                _mediator.lineage.clear()
            _mediator.standby.forget()  # (swept with the scope's other containers)
    if n:
        say(f"container sweep removed {n} container(s)/network(s) of scope {cfg.scope}")
    return n
