"""What one sandbox or container has cost the host so far (SandboxUsage,
ContainerUsage): CPU seconds, peak memory, bytes on its writable layer.

Read from the sandbox's own cgroup-v1 directories (helper/cgroups.py) and
its upper; a container's from Docker's one-shot stats and its SizeRw. The
daemons are unprivileged and cannot read either, hence a verb.
"""

from __future__ import annotations

import os

from helper import cgroups

_TICKS = os.sysconf("SC_CLK_TCK")


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _stat_field(memory_dir: str, *names: str) -> int | None:
    try:
        with open(os.path.join(memory_dir, "memory.stat"), encoding="ascii") as f:
            stats = dict(line.split() for line in f if line.count(" ") == 1)
    except FileNotFoundError:
        return None
    return next((int(stats[n]) for n in names if n in stats), None)


def _proc_cpu_ticks(pid: int) -> int:
    # utime+stime+cutime+cstime: a command's time moves into its reaper's
    # cutime when it exits, so over the live members every tick counts once.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0
    return sum(int(x) for x in fields[11:15])


def cpu_seconds(cg: dict[str, str]) -> float:
    """The sandbox's CPU time. cpuacct.usage where cpuacct is co-mounted with
    cpu (its own cgroup counts exited processes exactly); where it is a
    hierarchy of its own the helper keeps no cgroup there (helper.config
    CONTROLLERS), so the members' own and reaped children's times from
    /proc, at clock-tick resolution (a process whose parent ignored SIGCHLD
    is lost)."""
    ns = _read_int(os.path.join(cg["cpu"], "cpuacct.usage"))
    if ns is not None:
        return ns / 1e9
    return sum(_proc_cpu_ticks(pid) for pid in cgroups.procs(cg["freezer"])) / _TICKS


def tree_bytes(top: str) -> int:
    """Allocated bytes under ``top`` (st_blocks, not st_size: a sparse or
    whited-out file costs what it holds), staying on its filesystem."""
    total = 0
    try:
        dev = os.lstat(top).st_dev
    except FileNotFoundError:
        return 0
    stack = [top]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False) and st.st_dev == dev:
                    stack.append(entry.path)
    return total


def sandbox_usage(cg: dict[str, str], upper_dir: str) -> dict:
    memory = cg["memory"]
    if upper_dir:
        written = tree_bytes(os.path.join(upper_dir, "upper"))
    else:
        # A tmpfs upper lives in the sandbox's own mount namespace, detached
        # from every path the helper can name; its pages are charged to the
        # sandbox's memory cgroup as shmem (with /dev/shm's), what it holds now.
        written = _stat_field(memory, "total_shmem", "shmem") or 0
    out = {
        "cpu_s": round(cpu_seconds(cg), 6),
        "memory_peak_bytes": _read_int(os.path.join(memory, "memory.max_usage_in_bytes")) or 0,
        "disk_written_bytes": written,
    }
    peak = _read_int(os.path.join(cg["pids"], "pids.peak"))
    if peak is not None:  # newer kernels only
        out["pids_peak"] = peak
    return out


def container_usage(api, cid: str) -> dict:
    """From Docker's one-shot stats (cgroup v1 or v2 alike) and the
    container's writable layer (SizeRw, what docker ps --size shows)."""
    import docker.errors

    try:
        # one_shot: the totals now, without waiting a second for a second sample
        stats = api.stats(cid, stream=False, one_shot=True) or {}
    except docker.errors.InvalidVersion:  # an API before 1.41
        stats = api.stats(cid, stream=False) or {}
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    mem = stats.get("memory_stats") or {}
    listed = api.containers(all=True, filters={"id": cid}, size=True)
    out = {
        "cpu_s": round(int(cpu.get("total_usage") or 0) / 1e9, 6),
        # v1 reports max_usage; v2's stats have no peak, so usage now
        "memory_peak_bytes": int(mem.get("max_usage") or mem.get("usage") or 0),
        "disk_written_bytes": int(listed[0].get("SizeRw") or 0) if listed else 0,
    }
    return out
