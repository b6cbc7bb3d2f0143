"""The Java installation the Lucene search runs on.

The Shop backend expects a Conda-style Java environment: the JVM library at
``JAVA_HOME/lib/jvm/lib/server/libjvm.so`` and the launcher at
``JAVA_HOME/bin/java``. We check that exact layout instead of accepting any
JDK directory, so that a deployment names one Java and every machine loads
the same libjvm. ``scripts/prepare_java.py`` (``build_layout`` below) builds
the layout as a directory of symlinks over Debian's openjdk.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from camg.errors import ConfigError, PreparationMissing

LIBJVM = Path("lib/jvm/lib/server/libjvm.so")
JAVA = Path("bin/java")
#: Anserini 0.24 (pyserini 0.24.0) is Java 11 bytecode; Lucene 9 needs 11+.
MIN_FEATURE_VERSION = 11
PREPARE_STEP = (
    "python scripts/prepare_java.py --jdk /usr/lib/jvm/java-17-openjdk-amd64 --output JAVA_HOME"
)


def check_layout(java_home: str | os.PathLike) -> Path:
    """Return the libjvm path, or raise naming what is wrong with ``java_home``."""
    home = Path(java_home)
    if not home.is_absolute():
        raise ConfigError(f"java_home must be an absolute path, got {str(home)!r}")
    if not home.is_dir():
        raise PreparationMissing(f"java_home {home} does not exist", step=PREPARE_STEP)
    libjvm = home / LIBJVM
    java = home / JAVA
    missing = [str(p.relative_to(home)) for p in (libjvm, java) if not p.exists()]
    if missing:
        raise ConfigError(
            f"java_home {home} is not a Conda-style Java environment: missing "
            f"{', '.join(missing)} (expected JAVA_HOME/{LIBJVM} and JAVA_HOME/{JAVA}; "
            f"build it with: {PREPARE_STEP})"
        )
    if not os.access(java, os.X_OK):
        raise ConfigError(f"{java} is not executable")
    return libjvm


def feature_version(java_home: str | os.PathLike) -> int:
    """The Java feature version (11, 17, ...) ``JAVA_HOME/bin/java`` reports."""
    java = Path(java_home) / JAVA
    try:
        proc = subprocess.run(
            [str(java), "-XshowSettings:properties", "-version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {java}: {exc}") from None
    for line in proc.stderr.splitlines():
        key, _, value = line.strip().partition(" = ")
        if key == "java.specification.version":
            try:
                return int(value.split(".")[-1] if value.startswith("1.") else value)
            except ValueError:
                break
    raise ConfigError(
        f"{java} did not report java.specification.version "
        f"(exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
    )


def check(java_home: str | os.PathLike) -> Path:
    """Layout and version check; returns the libjvm path."""
    libjvm = check_layout(java_home)
    version = feature_version(java_home)
    if version < MIN_FEATURE_VERSION:
        raise ConfigError(
            f"{java_home}: Java {version} is too old for pyserini 0.24.0 "
            f"(needs {MIN_FEATURE_VERSION} or newer)"
        )
    return libjvm


def build_layout(jdk: str | os.PathLike, output: str | os.PathLike) -> Path:
    """Create (or confirm) a Conda-style JAVA_HOME of symlinks over ``jdk``.

    ``output/lib/jvm`` links to the JDK root, so the JVM finds its own
    modules and ``java.home`` through the real path; ``output/bin/<tool>``
    links each launcher. Idempotent: an existing correct layout is kept, a
    conflicting one is refused rather than overwritten.
    """
    jdk = Path(jdk).resolve()
    output = Path(output)
    if not (jdk / "lib/server/libjvm.so").is_file() or not (jdk / "bin/java").is_file():
        raise ConfigError(f"{jdk} is not a JDK/JRE root (no lib/server/libjvm.so and bin/java)")
    (output / "lib").mkdir(parents=True, exist_ok=True)
    (output / "bin").mkdir(parents=True, exist_ok=True)
    _link(output / "lib/jvm", jdk)
    for tool in sorted((jdk / "bin").iterdir()):
        if tool.is_file() and os.access(tool, os.X_OK):
            _link(output / "bin" / tool.name, tool)
    return check_layout(output.resolve())


def _link(path: Path, target: Path) -> None:
    try:
        os.symlink(target, path)
    except FileExistsError:
        if not path.is_symlink() or Path(os.readlink(path)) != target:
            raise ConfigError(
                f"{path} exists and is not a link to {target}; remove it or choose another --output"
            ) from None
