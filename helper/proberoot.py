"""The probe sandbox's root when none is configured: a small real tree of the
host's own Debian binaries (bash, coreutils, mount, unshare) and the shared
libraries they load, so the isolation probes run on any host out of the box.

It is built once into the helper's state directory and is never offered to
clients: only the probes use it, and only as a read-only lower.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from typing import cast

TOOLS = (
    "bash",
    "sh",
    "cat",
    "id",
    "ls",
    "sleep",
    "cp",
    "chmod",
    "touch",
    "head",
    "seq",
    "grep",
    "tr",
    "mount",
    "unshare",
    "setsid",
    "rm",
    "mkdir",
    "stat",
    "wc",
    "sort",
    "tail",
    "env",
)
_SEARCH = "/usr/bin:/bin:/usr/sbin:/sbin"


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])  # the dynamic loader
    return libs


def _copy(src: str, root: str) -> None:
    # Keep the host's path (it is what the loader and the binaries expect),
    # under the merged-/usr layout the tree itself uses.
    rel = src.lstrip("/")
    for merged in ("bin/", "sbin/", "lib/", "lib64/"):
        if rel.startswith(merged):
            rel = "usr/" + rel
    dest = os.path.join(root, rel)
    if os.path.exists(dest):
        return
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    shutil.copyfile(os.path.realpath(src), dest)
    os.chmod(dest, 0o755)


def ensure(state_dir: str) -> str:
    """The probe root under ``state_dir`` (built if missing or stale)."""
    which = [shutil.which(t, path=_SEARCH) for t in TOOLS]
    missing = [t for t, b in zip(TOOLS, which, strict=True) if b is None]
    if missing:
        raise FileNotFoundError(
            f"host lacks {', '.join(missing)} for the probe root; set probe_lowers"
        )
    binaries = cast(list[str], which)  # every tool was found: missing is empty
    key = hashlib.sha256("\0".join(f"{b}:{os.stat(b).st_mtime_ns}" for b in binaries).encode())
    root = os.path.join(state_dir, "probe-root", key.hexdigest()[:16])
    if os.path.exists(os.path.join(root, ".complete")):
        return root
    tmp = root + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for d in (
        "usr/bin",
        "usr/lib",
        "usr/lib64",
        "etc",
        "root",
        "home",
        "proc",
        "sys",
        "dev",
        "usr/share/doc/camg-probe",
    ):
        os.makedirs(os.path.join(tmp, d), mode=0o755, exist_ok=True)
    os.makedirs(os.path.join(tmp, "tmp"), exist_ok=True)
    os.chmod(os.path.join(tmp, "tmp"), 0o1777)
    for name in ("bin", "sbin"):
        os.symlink("usr/bin", os.path.join(tmp, name))
    for name in ("lib", "lib64"):
        os.symlink(f"usr/{name}", os.path.join(tmp, name))
    for tool, binary in zip(TOOLS, binaries, strict=True):
        _copy(binary, tmp)
        # Tools are found by their own name, wherever the host keeps them.
        link = os.path.join(tmp, "usr/bin", tool)
        if not os.path.exists(link):
            os.symlink(os.path.basename(binary), link)
        for lib in _libraries(binary):
            _copy(lib, tmp)
    with open(os.path.join(tmp, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/bash\n")
    with open(os.path.join(tmp, "etc/group"), "w") as f:
        f.write("root:x:0:\n")
    with open(os.path.join(tmp, "etc/hostname"), "w") as f:
        f.write("camg-probe\n")
    with open(os.path.join(tmp, "usr/share/doc/camg-probe/README"), "w") as f:
        f.write("A lower-layer file the probes try to delete.\n")
    open(os.path.join(tmp, ".complete"), "w").close()
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
    parent = os.path.dirname(root)
    for stale in os.listdir(parent):  # roots of binaries the host has since updated
        if os.path.join(parent, stale) != root:
            shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
    return root
