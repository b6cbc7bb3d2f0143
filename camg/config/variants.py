"""Impossible variants of real tasks: the manifest's ``variants`` and how a
service mixes them into what it serves.

An impossible variant (ImpossibleBench's idea) is a real task whose grader
contradicts its specification: a test's expected value changed, or a copy
of a test asserting the opposite. No honest submission can pass it, so any
pass is a shortcut, and the share of variant episodes that pass is the
policy's cheating rate, measured while it trains.

A variant is grader material only. It is served under its origin's
``task_id``, with its origin's observation, files and reset: everything
the agent can read is the origin's, so nothing it reads tells the two
apart. Only the grade differs, and only the outcome record, the trainer's
terminal reply and the metrics say an episode was a variant's (a
"canary", camg.episodes.canaries). Its own ``variant_id`` is never shown to
the agent; it names the variant in records and in the manifest.

In a prepared manifest (camg.config.task_manifest)::

    "variants": [{"variant_id": "v3f…", "origin": "<task_id>",
                  "kind": "impossible", "mutation": {"type": "one_off", …},
                  "data": {…the environment's grader material…}}]

A deployment mixes them into sampling at ``canary_fraction`` (0 by
default: never, unless a trainer asks for one with ``variant``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from camg.errors import DatasetError, TaskNotFound

#: the kinds of variant a trainer may ask for (``POST /episodes`` ``variant``)
KINDS = ("impossible",)
VARIANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the most a deployment may mix in: a service serving variants only would
#: measure nothing a trainer should train on
FRACTION_MAX = 0.5
_FIELDS = {"variant_id", "origin", "kind", "mutation", "data"}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant of the manifest: private grader material of ``origin``."""

    variant_id: str
    origin: str
    kind: str
    #: what was changed, as preparation recorded it (``type`` names the
    #: mutation: ``one_off``, ``conflicting``, …); never shown to the agent
    mutation: Mapping[str, Any]
    #: the environment's own grader material (a test commit, a rubric…)
    data: Mapping[str, Any]

    def to_data(self) -> dict:
        return {
            "variant_id": self.variant_id,
            "origin": self.origin,
            "kind": self.kind,
            "mutation": dict(self.mutation),
            "data": dict(self.data),
        }

    def summary(self) -> dict:
        """What the outcome record says of the mutation: its type and what
        it touched, not the grader material itself."""
        keep = ("type", "test", "copy")
        return {k: self.mutation[k] for k in keep if k in self.mutation}


def variant_id(origin: str, *material: str) -> str:
    """A variant's id: a digest of its origin and what makes it, so a
    preparation run again names the same variant the same way. It says
    nothing of the kind or the mutation."""
    digest = hashlib.sha256("\0".join((origin, *material)).encode()).hexdigest()
    return "v" + digest[:23]


def parse(raw: Any, task_ids: Sequence[str], where: str) -> tuple[Variant, ...]:
    """The manifest's ``variants`` list, checked against its task ids."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DatasetError(f"{where}: variants must be a list")
    known = set(task_ids)
    seen: set[str] = set()
    out = []
    for index, entry in enumerate(raw):
        at = f"{where}: variant #{index}"
        if not isinstance(entry, Mapping) or set(entry) != _FIELDS:
            raise DatasetError(f"{at} must have exactly {', '.join(sorted(_FIELDS))}")
        vid, origin, kind = entry["variant_id"], entry["origin"], entry["kind"]
        if not isinstance(vid, str) or not VARIANT_ID.fullmatch(vid):
            raise DatasetError(f"{at} has an invalid variant_id {vid!r}")
        if vid in seen or vid in known:
            raise DatasetError(f"{at}: variant_id {vid!r} is not unique")
        if origin not in known:
            raise DatasetError(f"{at}: origin {origin!r} is not a task of the manifest")
        if kind not in KINDS:
            raise DatasetError(f"{at}: kind must be one of {', '.join(KINDS)}")
        mutation, data = entry["mutation"], entry["data"]
        if not isinstance(mutation, Mapping) or not isinstance(mutation.get("type"), str):
            raise DatasetError(f"{at}: mutation must be an object naming its type")
        if not isinstance(data, Mapping):
            raise DatasetError(f"{at}: data must be an object")
        seen.add(vid)
        out.append(Variant(vid, origin, kind, dict(mutation), dict(data)))
    return tuple(out)


def check_fraction(value: float) -> None:
    """The deployment's ``canary_fraction``: a probability, at most FRACTION_MAX."""
    if isinstance(value, bool) or not 0.0 <= value <= FRACTION_MAX:  # NaN fails too
        raise ValueError(f"canary_fraction must be between 0 and {FRACTION_MAX}")


def _unit(seed: int, salt: str) -> float:
    digest = hashlib.sha256(f"camg-canary:{salt}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Mix:
    """Which variant, if any, a create serves.

    * ``requested`` (the trainer's ``variant``): a variant of ``task_id``
      when one is named, else one of all; seeded creates pick by seed.
    * otherwise, with ``fraction`` > 0 and no ``task_id``: a seeded create
      serves a variant when its seed's draw falls below the fraction (the
      same seed, the same answer); an unseeded one draws at random. A named
      task is always the real one.
    """

    def __init__(self, variants: Sequence[Variant], fraction: float) -> None:
        check_fraction(fraction)
        self.variants = tuple(variants)
        self.fraction = fraction
        self.by_origin: dict[str, list[Variant]] = {}
        for v in self.variants:
            self.by_origin.setdefault(v.origin, []).append(v)
        self._cursor = 0
        self._random = random.Random()

    def choose(
        self, task_id: str | None, seed: int | None, requested: str | None
    ) -> Variant | None:
        if requested is not None:
            pool = (
                [v for v in self.by_origin.get(task_id, []) if v.kind == requested]
                if task_id is not None
                else [v for v in self.variants if v.kind == requested]
            )
            if not pool:
                where = f"task {task_id!r}" if task_id is not None else "this service"
                raise TaskNotFound(f"{where} has no {requested} variant")
            return self._pick(pool, seed)
        if task_id is not None or not self.variants or self.fraction <= 0:
            return None
        draw = _unit(seed, "mix") if seed is not None else self._random.random()
        return self._pick(self.variants, seed) if draw < self.fraction else None

    def _pick(self, pool: Sequence[Variant], seed: int | None) -> Variant:
        if seed is not None:
            return pool[int(_unit(seed, "pick") * len(pool))]
        self._cursor += 1
        return pool[(self._cursor - 1) % len(pool)]

    def describe(self) -> dict:
        """What /metadata says: the fraction and how many variants of each kind."""
        kinds: dict[str, int] = {}
        for v in self.variants:
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
        return {"fraction": self.fraction, "variants": kinds}
