"""Warm disk uppers for forks: formatted and attached before they are asked for.

A fork of a disk-upper sandbox (helper/forks.py) gives the child an ext4 of
its own; making one (mkfs.ext4, a loop device, a mount) costs more than the
rest of the fork. The pool keeps up to ``ceilings.warm_uppers`` of them made
ahead (helper/uppers.py ``make_warm``), one background thread refilling
what forks take, so a fork only reserves and attaches one (``place``).

Sizes: each disk CreateSandbox names the size its peer is configured with
(``want``); the pool keeps entries for the most recent distinct sizes (at
most ``warm_uppers`` of them, sharing the ceiling), and a fork takes the
smallest entry at least as large as the child's bound, reserving the rest.
A fork that finds none makes its ext4 the old way: the pool is a speed-up,
never a condition.

Bounds, checked before any work like every verb's: the entries held and
being made never exceed ``warm_uppers`` (0: no pool, nothing made); sizes
come from creates already checked against ``ceilings.upper_bytes``. A pool
that fails to make an entry (no loop devices: a container) logs it once and
stops refilling; forks then make their own, unbounded or not, as creates do.

Teardown: an entry is one descriptor (its image unnamed, its filesystem
mounted nowhere, its loop device autoclearing), so ``drain`` (at the
helper's stop, through Registry.destroy_all) closes them, twice is harmless,
and a helper that dies leaves nothing for a sweep to find.
"""

from __future__ import annotations

import collections
import logging
import os
import threading

from helper import uppers

log = logging.getLogger("camg.helper")


def targets(sizes: list[int], limit: int) -> dict[int, int]:
    """How many entries of each wanted size (most recent last) to keep:
    the ceiling shared evenly, at least one each (there are at most
    ``limit`` sizes)."""
    if limit <= 0 or not sizes:
        return {}
    kept = sizes[-limit:]
    each = max(1, limit // len(kept))
    return {size: each for size in kept}


class UpperPool:
    def __init__(self, upper_root: str, limit: int) -> None:
        self.root = upper_root
        self.limit = limit
        self.cond = threading.Condition()
        self.sizes: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.warm: list[tuple[int, int]] = []  # (size, descriptor)
        self.making = 0
        self.broken = False
        self.thread: threading.Thread | None = None

    def want(self, size: int) -> None:
        """A disk sandbox of ``size`` bytes was created: keep entries of it."""
        if self.limit <= 0 or self.broken:
            return
        with self.cond:
            self.sizes[size] = None
            self.sizes.move_to_end(size)
            while len(self.sizes) > self.limit:
                self.sizes.popitem(last=False)
            stale = self._drop_unwanted()
            if self.thread is None:
                self.thread = threading.Thread(target=self._refill, name="upper-pool", daemon=True)
                self.thread.start()
            self.cond.notify_all()
        _close(stale)

    def take(self, size: int) -> tuple[int, int] | None:
        """(entry size, descriptor) of the smallest warm entry of at least
        ``size`` bytes, now the caller's; None when there is none."""
        with self.cond:
            fits = [e for e in self.warm if e[0] >= size]
            if not fits:
                return None
            entry = min(fits)
            self.warm.remove(entry)
            self.cond.notify_all()
            return entry

    def held(self) -> int:
        with self.cond:
            return len(self.warm)

    def status(self) -> dict[str, int]:
        """Entries held and being made, read together: each held one is a
        detached mount's descriptor of this helper that no sandbox owns
        (a census telling them from fork layers needs ``making`` at 0)."""
        with self.cond:
            return {"held": len(self.warm), "making": self.making}

    def drain(self) -> int:
        """Close every entry and forget every size (idempotent); returns how
        many were closed. One being made is closed when done."""
        with self.cond:
            self.sizes.clear()
            gone, self.warm = self.warm, []
            self.cond.notify_all()
        _close(gone)
        return len(gone)

    # -- the refilling thread -------------------------------------------

    def _drop_unwanted(self) -> list[tuple[int, int]]:
        want = targets(list(self.sizes), self.limit)
        kept: list[tuple[int, int]] = []
        stale: list[tuple[int, int]] = []
        count: collections.Counter[int] = collections.Counter()
        for entry in self.warm:
            count[entry[0]] += 1
            (kept if count[entry[0]] <= want.get(entry[0], 0) else stale).append(entry)
        self.warm = kept
        return stale

    def _next(self) -> int | None:
        """The size to make next (the most recent one short), if the
        ceiling allows another entry; the caller holds ``cond``."""
        if self.broken or len(self.warm) + self.making >= self.limit:
            return None
        have = collections.Counter(size for size, _ in self.warm)
        for size, n in reversed(list(targets(list(self.sizes), self.limit).items())):
            if have[size] < n:
                return size
        return None

    def _refill(self) -> None:
        while True:
            with self.cond:
                size = self._next()
                while size is None:
                    self.cond.wait()
                    size = self._next()
                self.making += 1
            fd = -1
            try:
                fd = uppers.make_warm(self.root, size)
            except Exception as exc:  # logged once; forks make their own
                log.warning(
                    "warm disk uppers disabled: making one of %d bytes failed: %s", size, exc
                )
            with self.cond:
                self.making -= 1
                if fd < 0:
                    self.broken = True
                    self.sizes.clear()
                    return
                self.warm.append((size, fd))
                stale = self._drop_unwanted()  # drained or evicted meanwhile
            _close(stale)


def _close(entries: list[tuple[int, int]]) -> None:
    for _size, fd in entries:
        os.close(fd)
