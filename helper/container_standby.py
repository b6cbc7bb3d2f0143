"""Standby children for container forks: created, bounded, never started.

Creating a container and putting its writable layer on its own ext4
(helper/container_disk.py) is most of a fresh container's cost before its
start; a fork need not wait for it. After a fork of a spec (the peer and
the parent's checked ContainerCreate parameters but the episode: image
digest, command, environment, user, limits, mount) the mediator keeps
``PER_SPEC`` children of exactly that spec created in the background, so
the next fork of it only copies the parent's upper into one and starts it.

A standby carries the project's labels with their values at creation:
the peer's service and uid, camg.fork=1, camg.pool=0 and no episode id
(labels are fixed at creation; the helper records which episode it went
to, as ContainerPool's claims do). It is not the peer's until a fork takes
it: ContainerList does not show it and the peer's ceilings do not count it
(it runs nothing: a container record, a sparse image, a loop mount).
Standbys live only while the peer holds a container of their spec: the
removal of the last one, the peer's ReleaseAll and the scope sweep remove
them (waiting for a refill under way, so nothing is created after).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Protocol

from camg.helper_wire import ContainerCreateParams, WireError
from helper.container_gate import Cancelled

log = logging.getLogger("camg.helper")
# Forks of one spec come in bursts (a rollout's branches); two ready
# children cover a fork and the next while the first is replaced.
PER_SPEC = 2


def spec_of(p: ContainerCreateParams) -> ContainerCreateParams:
    """What makes two containers interchangeable as fork children."""
    return dataclasses.replace(p, episode_id="", pool=False, labels={})


def _key(peer, p: ContainerCreateParams) -> str:
    spec = spec_of(p)
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return json.dumps(
        [peer.uid, peer.owner, fields],
        sort_keys=True,
        default=lambda v: dict(v) if hasattr(v, "keys") else list(v),
    )


class _Peer(Protocol):
    """The caller a spec belongs to (helper.sandbox_table.Peer)."""

    @property
    def uid(self) -> int: ...
    @property
    def owner(self) -> str: ...


@dataclasses.dataclass
class _Spec:
    peer: _Peer
    params: ContainerCreateParams
    ready: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (id, layer dir)
    filling: threading.Thread | None = None
    dropped: bool = False  # its refill stops at its next check


class Standby:
    def __init__(self, m, per_spec: int = PER_SPEC) -> None:
        self.m = m
        self.per_spec = per_spec
        self.specs: dict[str, _Spec] = {}  # guarded by m.lock

    def labels(self, peer, p: ContainerCreateParams) -> dict[str, str]:
        return {**self.m.labels_for(peer, spec_of(p)), "camg.fork": "1"}

    def take(self, peer, p: ContainerCreateParams) -> tuple[str, str] | None:
        """A ready child of this spec, now the caller's to start or remove."""
        with self.m.lock:
            spec = self.specs.get(_key(peer, p))
            return spec.ready.pop(0) if spec and spec.ready else None

    def refill(self, peer, p: ContainerCreateParams) -> None:
        """Bring this spec back to ``per_spec`` ready children, in the background."""
        if self.per_spec <= 0:
            return
        key = _key(peer, p)
        with self.m.lock:
            spec = self.specs.setdefault(key, _Spec(peer, spec_of(p)))
            if spec.filling is not None or len(spec.ready) >= self.per_spec:
                return
            spec.filling = threading.Thread(
                target=self._fill, args=(key, spec), name="fork-standby", daemon=True
            )
            spec.filling.start()

    def _fill(self, key: str, spec: _Spec) -> None:
        m = self.m
        try:
            while True:
                with m.lock:
                    if spec.dropped or len(spec.ready) >= self.per_spec or not self._used(key):
                        return
                try:
                    # The image is checked against the manifest as it is now.
                    image = m.check_image(spec.params.image)
                    # A create like any (a slot of m.starts, in turn with the
                    # foreground's); a drop calls the wait off.
                    with m.starts.slot(m.start_deadline(), cancelled=lambda: spec.dropped):
                        made = m.docker.create(
                            name=m.container_name(spec.peer),
                            image=image,
                            labels=self.labels(spec.peer, spec.params),
                            **m.run_spec(spec.params),
                        )
                except Cancelled:
                    return
                except WireError as exc:  # the next fork of the spec tries again
                    log.warning("creating a standby fork child failed: %s", exc.message)
                    return
                with m.lock:
                    spec.ready.append(made)
        finally:
            with m.lock:
                spec.filling = None

    def _used(self, key: str) -> bool:
        """Called with m.lock held: the peer still holds a container of this spec."""
        return any(
            h.params is not None and _key(h, h.params) == key
            for h in self.m.held.values()
            if h.pidfd >= 0
        )

    def unclaimed(self, listed: dict) -> bool:
        """A container of dockerd's list is a standby no fork took (yet): its
        labels say standby and the helper holds no container of its id
        (one a refill is creating right now included)."""
        labels = listed.get("Labels") or {}
        if labels.get("camg.fork") != "1" or labels.get("camg.episode") != "":
            return False
        with self.m.lock:
            return listed["Id"] not in self.m.held

    def ids(self) -> set[str]:
        with self.m.lock:
            return {cid for spec in self.specs.values() for cid, _ in spec.ready}

    def drop_unused(self) -> None:
        """Remove the standbys of every spec the peer no longer holds a container of."""
        with self.m.lock:
            keys = [k for k in self.specs if not self._used(k)]
        self._drop(keys)

    def drop_peer(self, peer) -> None:
        with self.m.lock:
            keys = [
                k
                for k, s in self.specs.items()
                if (s.peer.uid, s.peer.owner) == (peer.uid, peer.owner)
            ]
        self._drop(keys)

    def _drop(self, keys: list[str]) -> None:
        for key in keys:
            with self.m.lock:
                spec = self.specs.pop(key, None)
                if spec is not None:
                    spec.dropped = True
                    filling = spec.filling
            if spec is None:
                continue
            if filling is not None:
                # one create at most: it stops at its next check (or leaves the queue)
                filling.join()
            with self.m.lock:
                ready, spec.ready = spec.ready, []
            for cid, _ in ready:
                try:
                    self.m.docker.remove(cid)
                except WireError as exc:  # labelled: the scope sweep takes it
                    log.warning("removing standby %s failed: %s", cid[:12], exc.message)

    def forget(self) -> None:
        """After the scope sweep (which removed the standbys with every
        other container): drop them all, and one a refill made meanwhile."""
        with self.m.lock:
            keys = list(self.specs)
        self._drop(keys)
