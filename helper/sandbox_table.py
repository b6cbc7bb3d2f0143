"""The helper's sandboxes: admission (ceilings, probes, paths), ownership, teardown.

A sandbox belongs to the peer that created it: the uid from SO_PEERCRED plus
the owner label the client sends (so two daemons running as the same user
can release only their own sandboxes). Names of every kernel object are
derived from the id generated here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import threading
import time

from camg.helper_wire import CreateSandboxParams, WireError
from helper import cgroups, forks, paths, uppers
from helper.config import HelperConfig
from helper.ledger import Ledger, Record, remove_upper
from helper.sandbox import Sandbox
from helper.upper_pool import UpperPool

log = logging.getLogger("camg.helper")
_FIRST_PROBES_WAIT = 120.0  # seconds a create waits for the start-up probes
# The overlay option string holds lowerdir, upperdir and workdir within one
# 4 KiB page; the upper and work paths take at most ~500 bytes.
_LOWERDIR_BYTES = 3072
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class Peer:
    uid: int
    gid: int
    pid: int
    owner: str


class Registry:
    def __init__(
        self, config: HelperConfig, parents: dict[str, str], ledger: Ledger, init_binary: str
    ) -> None:
        self.config = config
        self.parents = parents
        self.ledger = ledger
        self.init_binary = init_binary
        self.scratch = os.path.join(config.state_dir, "mnt")
        os.makedirs(self.scratch, mode=0o700, exist_ok=True)
        self.lock = threading.Lock()
        self.sandboxes: dict[str, Sandbox] = {}
        self.owners: dict[str, tuple[int, str]] = {}
        self.probe_failure: str | None = "isolation probes have not run yet"
        # Socket activation hands us clients before the start-up probes are
        # done; a create in that window waits for their verdict instead of
        # failing a daemon's first episode.
        self.first_probes_done = threading.Event()
        # Disk uppers made ahead for forks (helper/upper_pool.py).
        self.warm_uppers = UpperPool(config.upper_root, config.ceilings.warm_uppers)

    # -- admission --------------------------------------------------------

    def check_spec(
        self, spec: CreateSandboxParams, roots: tuple[str, ...] = ()
    ) -> tuple[list[str], int]:
        c = self.config.ceilings
        if not spec.lowers:
            raise WireError("bad_request", "lowers: at least one lower is required")
        if len(spec.lowers) > c.lowers:
            raise WireError("limit_exceeded", f"lowers: at most {c.lowers} lowers")
        lowers = [
            paths.resolve_lower(p, self.config.lower_roots + roots, self.config.private_roots)
            for p in spec.lowers
        ]
        # mount(2) copies at most one page of options; sbxinit would fail
        # after the cgroups and upper exist.
        if len(":".join(lowers)) > _LOWERDIR_BYTES:
            raise WireError("limit_exceeded", f"lowers: their paths exceed {_LOWERDIR_BYTES} bytes")
        if not 4 << 20 <= spec.memory_bytes <= c.memory_bytes:
            raise WireError(
                "limit_exceeded", f"memory_bytes: must be within [4 MiB, {c.memory_bytes}]"
            )
        if not 0.01 <= spec.cpu_quota <= c.cpu_quota:
            raise WireError("limit_exceeded", f"cpu_quota: must be within [0.01, {c.cpu_quota}]")
        if not 8 <= spec.pids_max <= c.pids_max:
            raise WireError("limit_exceeded", f"pids_max: must be within [8, {c.pids_max}]")
        if not _HOSTNAME.match(spec.hostname):
            raise WireError(
                "bad_request", "hostname: lowercase letters, digits and '-', at most 63"
            )
        if spec.upper not in ("tmpfs", "disk"):
            raise WireError("bad_request", "upper: must be 'tmpfs' or 'disk'")
        size = spec.upper_bytes or self.config.tmpfs_upper_bytes
        if not 1 << 20 <= size <= c.upper_bytes:
            raise WireError(
                "limit_exceeded", f"upper_bytes: must be within [1 MiB, {c.upper_bytes}]"
            )
        return lowers, size

    def _admit(self, peer: Peer, sandbox_id: str) -> None:
        c = self.config.ceilings
        if self.probe_failure is not None:
            raise WireError("probes_failed", f"isolation probes failed: {self.probe_failure}")
        if len(self.owners) >= c.sandboxes_total:
            raise WireError(
                "at_capacity", f"the helper holds {c.sandboxes_total} sandboxes already"
            )
        mine = sum(1 for o in self.owners.values() if o == (peer.uid, peer.owner))
        if mine >= c.sandboxes_per_peer:
            raise WireError(
                "at_capacity", f"this peer holds {c.sandboxes_per_peer} sandboxes already"
            )
        self.owners[sandbox_id] = (peer.uid, peer.owner)

    # -- lifecycle --------------------------------------------------------

    def create(self, peer: Peer, spec: CreateSandboxParams, *, probe: bool = False) -> Sandbox:
        # The helper's own probe root is a lower for the probes only.
        extra = (os.path.join(self.config.state_dir, "probe-root"),) if probe else ()
        lowers, size = self.check_spec(spec, extra)
        if not probe:
            self.first_probes_done.wait(_FIRST_PROBES_WAIT)
        sandbox_id = secrets.token_hex(8)
        with self.lock:
            if probe:
                self.owners[sandbox_id] = (peer.uid, peer.owner)
            else:
                self._admit(peer, sandbox_id)
        cg = cgroups.paths(self.parents, sandbox_id)
        upper_dir = ""
        if spec.upper == "disk":
            upper_dir = os.path.join(self.config.upper_root, cgroups.cgroup_name(sandbox_id))
        record = Record(sandbox_id, peer.uid, peer.owner, time.time(), cg, upper_dir, lowers)
        try:
            self.ledger.write(record)
            cgroups.create(
                cg, memory_bytes=spec.memory_bytes, cpu_quota=spec.cpu_quota, pids_max=spec.pids_max
            )
            if upper_dir:
                # Its own filesystem of `size` bytes (helper/uppers.py).
                uppers.create_disk(upper_dir, size)
                if not probe:
                    self.warm_uppers.want(size)
            sandbox = Sandbox.spawn(
                record,
                init_binary=self.init_binary,
                hostname=spec.hostname,
                scratch=self.scratch,
                lowers=lowers,
                tmpfs_bytes=size,
                shm=self.config.ceilings.shm(spec.memory_bytes),
                timeout=self.config.create_timeout,
            )
        except BaseException:
            self._forget(record)
            raise
        sandbox.spec, sandbox.size = (None if probe else spec), size
        with self.lock:
            self.sandboxes[sandbox_id] = sandbox
        return sandbox

    def fork(self, peer: Peer, parent: Sandbox) -> tuple[Sandbox, dict]:
        """A new sandbox of ``peer`` over ``parent``'s filesystem as it stands
        (helper/forks.py); ceilings are checked before anything is made."""
        return forks.fork(self, peer, parent)

    def _forget(self, record: Record) -> None:
        try:
            cgroups.remove(record.cgroups)
            remove_upper(record.upper_dir)
            self.ledger.remove(record.sandbox_id)
        except OSError as exc:
            log.error(
                "cleanup of sandbox %s failed, left for the sweep: %s", record.sandbox_id, exc
            )
        with self.lock:
            self.owners.pop(record.sandbox_id, None)

    def get(self, peer: Peer, sandbox_id: object) -> Sandbox:
        if not isinstance(sandbox_id, str):
            raise WireError("bad_request", "sandbox_id: expected a string")
        with self.lock:
            sandbox = self.sandboxes.get(sandbox_id)
            owner = self.owners.get(sandbox_id)
        # Someone else's sandbox is reported exactly like a missing one.
        if sandbox is None or owner != (peer.uid, peer.owner):
            raise WireError("not_found", f"no sandbox {sandbox_id!r} for this peer")
        return sandbox

    def destroy(self, sandbox: Sandbox) -> bool:
        try:
            done = sandbox.destroy(self.ledger)
        finally:
            with self.lock:
                if sandbox.destroyed and self.sandboxes.get(sandbox.id) is sandbox:
                    del self.sandboxes[sandbox.id]
                    self.owners.pop(sandbox.id, None)
        return done

    def mine(self, peer: Peer) -> list[Sandbox]:
        with self.lock:
            return [
                s for i, s in self.sandboxes.items() if self.owners.get(i) == (peer.uid, peer.owner)
            ]

    def destroy_all(self) -> int:
        """Every sandbox, and every warm upper (the helper's stop)."""
        self.warm_uppers.drain()
        with self.lock:
            everything = list(self.sandboxes.values())
        n = 0
        for sandbox in everything:
            try:
                n += self.destroy(sandbox)
            except OSError as exc:
                log.error("destroy of sandbox %s failed, left for the sweep: %s", sandbox.id, exc)
        return n
