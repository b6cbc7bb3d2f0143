"""What a run left beyond a helper's own holdings (camg/sandboxes/census.py counts
those): Docker containers carrying a helper's ``camg.helper`` label, the
memory they use, a process's RSS, and the files of a service's state
directory that its records do not explain."""

from __future__ import annotations

import os
from pathlib import Path

from camg.episodes.signing import PUBLIC_FILE

DOCKER_SOCKET = "/var/run/docker.sock"
_api = None


def labelled_containers() -> list[dict]:
    """Every container, running or not, labelled ``camg.helper`` (any
    helper's); none without a Docker engine."""
    global _api
    if not os.path.exists(DOCKER_SOCKET):
        return []
    try:
        if _api is None:
            import docker
            _api = docker.APIClient(base_url=f"unix://{DOCKER_SOCKET}", timeout=60)
        return _api.containers(all=True, filters={"label": ["camg.helper"]})
    except Exception:  # noqa: BLE001  no dockerd: no container can have leaked
        return []


def scope_of(container: dict) -> str:
    return (container.get("Labels") or {}).get("camg.helper", "")


def containers(scope: str) -> int:
    """Containers of the helper scope ``scope``."""
    return sum(1 for c in labelled_containers() if scope_of(c) == scope)


#: dockerd's cgroupfs parents of its containers' memory cgroups: cgroup v1's
#: memory hierarchy, cgroup v2's unified one
MEMORY_CGROUP_PARENTS = (Path("/sys/fs/cgroup/memory/docker"), Path("/sys/fs/cgroup/docker"))


def running_containers(scope: str) -> list[str]:
    """Ids of the running containers of the helper scope ``scope``."""
    return [c["Id"] for c in labelled_containers()
            if scope_of(c) == scope and c.get("State") == "running"]


def container_memory(scope: str) -> tuple[int, int]:
    """(running containers of ``scope``, their memory cgroups' usage in
    bytes, page cache included), read on the host (dockerd's cgroupfs driver)."""
    ids = running_containers(scope)
    total = 0
    for cid in ids:
        for path in (MEMORY_CGROUP_PARENTS[0] / cid / "memory.usage_in_bytes",
                     MEMORY_CGROUP_PARENTS[1] / cid / "memory.current"):
            try:
                total += int(path.read_text())
                break
            except (OSError, ValueError):
                continue
    return len(ids), total


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def state_strays(state_dir: Path, episode_ids: set[str], files: tuple[str, ...] = (),
                 dirs: tuple[str, ...] = (), records: list[dict] = ()) -> list[str]:
    """Files of a service's state directory beyond its records: outcomes.jsonl
    (and outcomes.pub beside it), one trajectory per episode and the submissions the records name
    (``submissions/<aa>/<sha256>``, camg/episodes/submissions.py); ``files`` the
    environment keeps (e.g. AutoResearch's clean.json), ``dirs`` whose files
    must each be named for an episode of the run (Visual's screenshots)."""
    named = {(r.get("submission") or {}).get("sha256") for r in records}
    strays = []
    for entry in sorted(os.listdir(state_dir)) if state_dir.exists() else []:
        # the outcome log and the public key it is checked against (camg/episodes/outcomes.py)
        if entry in ("outcomes.jsonl", PUBLIC_FILE) or entry in files:
            continue
        if entry == "trajectories" or entry in dirs:
            for name in sorted(os.listdir(state_dir / entry)):
                if name.split(".")[0] not in episode_ids:
                    strays.append(f"{entry}/{name}")
            continue
        if entry == "submissions":
            for sub in sorted(os.listdir(state_dir / entry)):
                for name in sorted(os.listdir(state_dir / entry / sub)):
                    if f"sha256:{name}" not in named:
                        strays.append(f"{entry}/{sub}/{name}")
            continue
        strays.append(entry)
    return strays
