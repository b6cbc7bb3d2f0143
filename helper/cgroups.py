"""cgroup-v1 directories of one sandbox: cpu, memory, pids, freezer.

Names are derived from helper-generated ids only ("sb-<id>"). The sandbox
init joins all four before it unshares, so every process of the sandbox is
inside them: limits bound the whole sandbox and the freezer holds exactly
the processes a timeout or a sweep must kill.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from helper.config import CONTROLLERS

PREFIX = "sb-"


def cgroup_name(sandbox_id: str) -> str:
    return PREFIX + sandbox_id


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def ensure_parents(parents: dict[str, str], record: str) -> None:
    """Create missing parents, noting in ``record`` the ones we created.

    Only those are ever removed again (``release_parents``): a parent that
    was there before — systemd's delegated cgroup, an operator's — is not ours.
    """
    for ctrl, path in parents.items():
        try:
            os.makedirs(path)
        except FileExistsError:
            pass
        else:
            with open(record, "a", encoding="utf-8") as f:
                f.write(path + "\n")
        if ctrl == "memory":
            # Hierarchical accounting so a parent limit (if any) covers sandboxes.
            try:
                if _read(os.path.join(path, "memory.use_hierarchy")).strip() == "0":
                    _write(os.path.join(path, "memory.use_hierarchy"), "1")
            except OSError:
                pass  # cannot change once the parent has children; accounting still works


def release_parents(record: str) -> None:
    """rmdir the parents ``ensure_parents`` created; ones still busy stay noted."""
    try:
        with open(record, encoding="utf-8") as f:
            created = list(dict.fromkeys(line.strip() for line in f if line.strip()))
    except FileNotFoundError:
        return  # nothing of ours
    busy = []
    for path in created:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass  # already gone
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            busy.append(path)  # a sandbox or process still lives there
    if busy:
        with open(record, "w", encoding="utf-8") as f:
            f.write("".join(p + "\n" for p in busy))
    else:
        os.unlink(record)


def paths(parents: dict[str, str], sandbox_id: str) -> dict[str, str]:
    return {ctrl: os.path.join(parents[ctrl], cgroup_name(sandbox_id)) for ctrl in CONTROLLERS}


def create(cg: dict[str, str], *, memory_bytes: int, cpu_quota: float, pids_max: int) -> None:
    for path in cg.values():
        os.mkdir(path, 0o755)
    mem = cg["memory"]
    _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
    memsw = os.path.join(mem, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):
        # memory+swap equal to memory: the sandbox gets no swap at all.
        _write(memsw, str(memory_bytes))
    else:
        _write(os.path.join(mem, "memory.swappiness"), "0")
    period = 100_000
    _write(os.path.join(cg["cpu"], "cpu.cfs_period_us"), str(period))
    _write(os.path.join(cg["cpu"], "cpu.cfs_quota_us"), str(max(1000, int(cpu_quota * period))))
    _write(os.path.join(cg["pids"], "pids.max"), str(pids_max))


def procs(path: str) -> list[int]:
    try:
        return [int(x) for x in _read(os.path.join(path, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []


def _set_freezer(path: str, state: str, deadline: float) -> None:
    _write(os.path.join(path, "freezer.state"), state)
    while (
        _read(os.path.join(path, "freezer.state")).strip() != state and time.monotonic() < deadline
    ):
        time.sleep(0.001)


def kill_all(freezer: str, timeout: float = 5.0, spare: int = 0) -> int:
    """Freeze, SIGKILL every member but ``spare``, thaw; returns how many.

    Frozen, nothing can fork away between reading the member list and the
    kill; the signals are delivered on thaw.
    """
    if not os.path.isdir(freezer):
        return 0
    deadline = time.monotonic() + timeout
    _set_freezer(freezer, "FROZEN", deadline)
    killed = 0
    try:
        for pid in procs(freezer):
            if pid == spare or pid <= 1:
                continue
            killed += 1
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        _set_freezer(freezer, "THAWED", deadline)
    return killed


def remove(cg: dict[str, str], timeout: float = 5.0) -> None:
    """rmdir every cgroup; EBUSY (members still exiting) is retried with backoff.

    The freezer goes last so a straggler found on the way can still be
    frozen and killed as a group.
    """
    deadline = time.monotonic() + timeout
    for ctrl in sorted(cg, key=lambda c: c == "freezer"):
        path = cg[ctrl]
        delay = 0.0005
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break  # already gone: the only error that means success
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                if "freezer" in cg and os.path.isdir(cg["freezer"]):
                    kill_all(cg["freezer"], max(0.1, deadline - time.monotonic()))
                for pid in procs(path):
                    if pid <= 1:
                        continue
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(delay)
                delay = min(delay * 2, 0.05)


def orphans(parents: dict[str, str]) -> dict[str, dict[str, str]]:
    """Sandbox cgroups found under the parents, by sandbox id (for the sweep)."""
    found: dict[str, dict[str, str]] = {}
    for ctrl, parent in parents.items():
        try:
            names = os.listdir(parent)
        except FileNotFoundError:
            continue
        for name in names:
            if name.startswith(PREFIX) and os.path.isdir(os.path.join(parent, name)):
                found.setdefault(name[len(PREFIX) :], {})[ctrl] = os.path.join(parent, name)
    return found
