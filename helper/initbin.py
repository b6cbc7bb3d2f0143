"""Locating or building the per-sandbox init (sbxinit.c).

The binary is keyed by the hash of its source, so a helper never runs an
init built from other source than the one it ships with.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

from helper.config import ConfigError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sbxinit.c")


def ensure(configured: str, build_dir: str) -> str:
    if configured:
        if not os.access(configured, os.X_OK):
            raise ConfigError(f"init_binary: {configured} is not an executable file")
        return configured
    with open(SOURCE, "rb") as f:
        # The build recipe is part of the key, so a change to it rebuilds.
        digest = hashlib.sha256(f.read() + b"\0-O2 -static").hexdigest()[:16]
    target = os.path.join(build_dir, f"camg-sbxinit-{digest}")
    if os.access(target, os.X_OK):
        return target
    os.makedirs(build_dir, mode=0o755, exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    cc = os.environ.get("CC", "cc")
    # Static when libc.a is there: no dynamic loader work on every spawn.
    for flags in (["-static"], []):
        try:
            proc = subprocess.run(
                [cc, "-O2", "-Wall", *flags, "-o", tmp, SOURCE],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except FileNotFoundError:
            raise ConfigError(
                f"cannot build the sandbox init: no C compiler ({cc}); "
                "install build-essential or set init_binary"
            ) from None
        if proc.returncode == 0:
            break
    if proc.returncode != 0:
        raise ConfigError(f"cannot build the sandbox init: {proc.stderr.strip()[-2000:]}")
    os.chmod(tmp, 0o755)
    os.rename(tmp, target)
    return target
