"""One JSON record per sandbox under the helper's state directory.

Written (atomically, by rename) before any kernel object of the sandbox
exists and removed only after every one is gone, so a helper or daemon that
crashes at any point leaves enough behind for the sweep to reclaim it. The
sweep also catches cgroups and uppers that carry the helper's prefix but have
no record (a crash between mkdir and the record is impossible by ordering,
but a deleted state directory is not).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from camg import atomic
from helper import cgroups, uppers


@dataclasses.dataclass(frozen=True)
class Record:
    sandbox_id: str
    uid: int
    owner: str
    created_at: float
    cgroups: dict[str, str]
    upper_dir: str  # "" for a tmpfs upper (it vanishes with the mount namespace)
    lowers: list[str]


class Ledger:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def _path(self, sandbox_id: str) -> str:
        return os.path.join(self.directory, sandbox_id + ".json")

    def write(self, record: Record) -> None:
        atomic.write_bytes(
            self._path(record.sandbox_id),
            json.dumps(dataclasses.asdict(record)).encode(),
            mode=0o600,
        )

    def remove(self, sandbox_id: str) -> None:
        try:
            os.unlink(self._path(sandbox_id))
        except FileNotFoundError:
            pass  # already gone

    def records(self) -> list[Record]:
        out = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.endswith(".tmp"):
                os.unlink(path)  # a write that never reached its rename
                continue
            if not name.endswith(".json"):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    out.append(Record(**json.load(f)))
            except (OSError, ValueError, TypeError):
                # Unreadable: keep its id so the cgroup scan still finds it.
                out.append(Record(name[:-5], -1, "", 0.0, {}, "", []))
        return out


def remove_upper(upper_dir: str) -> None:
    uppers.remove(upper_dir)


def sweep(
    ledger: Ledger, parents: dict[str, str], upper_root: str, log: Callable[[str], None]
) -> int:
    """Reclaim every sandbox a previous helper left; returns how many."""
    found: dict[str, Record] = {r.sandbox_id: r for r in ledger.records()}
    stray = cgroups.orphans(parents)
    reclaimed = 0
    for sandbox_id in sorted(set(found) | set(stray)):
        record = found.get(sandbox_id)
        cg = dict(cgroups.paths(parents, sandbox_id))
        if record is not None:
            cg.update(record.cgroups)
        cgroups.kill_all(cg.get("freezer", ""))
        cgroups.remove(cg)
        remove_upper(record.upper_dir if record else "")
        remove_upper(os.path.join(upper_root, cgroups.cgroup_name(sandbox_id)))
        ledger.remove(sandbox_id)
        log(f"swept sandbox {sandbox_id}")
        reclaimed += 1
    return reclaimed
