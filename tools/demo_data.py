"""What the environments' demo builders share (environments/<env>/demo/
data.py, named by each plugin's ``demo_prepare``; run by
packaging/prepare_demo.py as root).
"""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

from camg.config.host_private import private_dir

DOCKER_SOCKET = "unix:///var/run/docker.sock"


def same_tree(a: Path, b: Path) -> bool:
    if not b.is_dir():
        return False
    cmp = filecmp.dircmp(a, b)
    stack = [cmp]
    while stack:
        c = stack.pop()
        if c.left_only or c.right_only or c.diff_files or c.funny_files:
            return False
        stack.extend(c.subdirs.values())
    return True


def readable(path: Path) -> None:
    """The services (User=camg) read all of it, and what goes into a sandbox
    or a task container (General's agent environment, Visual's CDN mirror)
    is read there through its files' "other" bits; but rows, mirrors, gold
    patches, oracle files and references are grading material, so the tree
    itself is root's and the services' only (private_dir)."""
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(path)], check=True)
    private_dir(path)


def pull_into_dockerd(refs: list[str]) -> None:
    """While the loopback registry still serves them: dockerd keeps the
    images by digest after the registry is gone."""
    import docker

    api = docker.APIClient(base_url=DOCKER_SOCKET, timeout=900)
    try:
        for ref in refs:
            for line in api.pull(ref, stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    raise RuntimeError(f"pulling {ref}: {line['error']}")
    finally:
        api.close()
