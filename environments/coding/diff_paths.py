"""Which paths of the agent's diff count, and the diff itself.

A change to a test, or to whatever decides test collection or how Python
starts, never counts: such file sections are dropped from the diff before
it is applied (so recreating a test file the agent never saw cannot make
the whole diff fail), and the grader script reverts anything that slipped
through patch's fuzzier matching (environments.coding.grader_scripts). The diff
screen (environments.coding.integrity) reads the same sections.
"""

from __future__ import annotations

import fnmatch
import re
import shlex

# Paths whose changes never count: tests, and files that change what pytest
# collects or how Python starts (a sitecustomize or .pth runs before any test).
PROTECTED_DIRS = ("test", "tests", "testing")
PROTECTED_NAMES = (
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "noxfile.py",
    "sitecustomize.py",
    "usercustomize.py",
)
PROTECTED_GLOBS = ("test_*.py", "*_test.py", "*.pth")
# Build and cache artifacts the agent's test runs leave behind; never a fix.
DIFF_EXCLUDES = ("**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**", "**/*.egg-info/**")


def is_protected(path: str) -> bool:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return False
    if any(part in PROTECTED_DIRS for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in PROTECTED_NAMES or any(fnmatch.fnmatchcase(name, g) for g in PROTECTED_GLOBS)


# --- the agent's diff -------------------------------------------------------


#: diff_command's exit status when a file is larger than any diff of its
#: ``limit`` could carry
TOO_LARGE_EXIT = 75
#: git's binary diff is deflate in base85: deflate shrinks at most about
#: 1032:1, so a file over ``limit`` times this can never fit a diff
_DEFLATE_MAX_RATIO = 1032


def diff_command(
    snapshot: str,
    private_git: str = "/var/lib/camg-task/git",
    workdir: str = "/testbed",
    limit: int | None = None,
) -> str:
    """Shell command (run as root in the agent's sandbox) printing its diff.

    Uses the root-only copy of the workspace's git directory, so whatever
    the agent did to /testbed/.git is irrelevant. Special files (fifos,
    sockets, devices) cannot be part of a diff and would make ``git add``
    fail, so they are removed first. With a ``limit`` (bytes of diff), a
    regular file too large for any diff of that size ends it with
    TOO_LARGE_EXIT before git reads it: a sparse terabyte would otherwise
    keep git hashing zeros until the collection's deadline.
    """
    git = (
        "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent "
        f"git --git-dir={shlex.quote(private_git)} --work-tree={shlex.quote(workdir)} "
        "-c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null "
        "-c core.untrackedCache=false "
        "-c core.checkStat=minimal -c core.trustctime=false"
    )
    excludes = " ".join(shlex.quote(f":(exclude,glob){g}") for g in DIFF_EXCLUDES)
    too_large = (
        f'if [ -n "$(find . -path ./.git -prune -o -type f '
        f'-size +{limit * _DEFLATE_MAX_RATIO}c -print -quit)" ]; '
        f"then exit {TOO_LARGE_EXIT}; fi; "
        if limit
        else ""
    )
    return (
        f"set -e; cd {shlex.quote(workdir)}; "
        f"find . -path ./.git -prune -o ! -type f ! -type d ! -type l -print0 "
        f"| xargs -0 -r rm -f --; {too_large}"
        f"{git} add -A -- . {excludes}; "
        f"{git} diff --cached --binary --full-index --no-color --no-ext-diff "
        f"--no-textconv --no-renames {snapshot}"
    )


_SECTION = re.compile(rb"^diff --git ", re.M)
_PATH_LINES = (b"--- ", b"+++ ", b"rename from ", b"rename to ", b"copy from ", b"copy to ")


def split_sections(diff: bytes) -> list[bytes]:
    """The ``diff --git`` file sections of ``diff``, in order."""
    starts = [m.start() for m in _SECTION.finditer(diff)]
    return [diff[b:e] for b, e in zip(starts, starts[1:] + [len(diff)], strict=False)]


def filter_diff(diff: bytes) -> tuple[bytes, list[str]]:
    """Drop every file section of ``diff`` that touches a protected path."""
    starts = [m.start() for m in _SECTION.finditer(diff)]
    if not starts:
        return b"", []
    kept, dropped = [diff[: starts[0]]] if starts[0] else [], []
    for section in split_sections(diff):
        paths = section_paths(section)
        touched = [p for p in paths if is_protected(p)]
        if touched:
            dropped.append(touched[0])
        else:
            kept.append(section)
    return b"".join(kept), dropped


def section_paths(section: bytes) -> list[str]:
    lines = section.split(b"\n")
    header = lines[0][len(b"diff --git ") :]
    paths = []
    if header.startswith(b'"'):
        first, rest = _unquote(header)
        paths.append(first)
        if rest.strip().startswith(b'"'):
            paths.append(_unquote(rest.strip())[0])
        else:
            paths.append(rest.strip().decode("utf-8", "replace"))
    else:
        # Unquoted "a/X b/Y": ambiguous only when X contains " b/"; the
        # ---/+++/rename lines below name the paths again either way.
        text = header.decode("utf-8", "replace")
        first, sep, second = text.partition(" b/")
        paths += [first, "b/" + second] if sep else [text]
    for line in lines[1:]:
        if line.startswith((b"@@", b"GIT binary patch")):
            break
        for prefix in _PATH_LINES:
            if line.startswith(prefix):
                value = line[len(prefix) :].split(b"\t")[0]
                if value.startswith(b'"'):
                    paths.append(_unquote(value)[0])
                else:
                    paths.append(value.decode("utf-8", "replace"))
    cleaned = []
    for path in paths:
        if path == "/dev/null":
            continue
        if path[:2] in ("a/", "b/") and not path.startswith(("a//", "b//")):
            path = path[2:]
        cleaned.append(path)
    return cleaned


def _unquote(data: bytes) -> tuple[str, bytes]:
    """Decode one C-quoted git path at the start of ``data``; return the rest."""
    out = bytearray()
    i = 1
    escapes = {
        ord("n"): 10,
        ord("t"): 9,
        ord('"'): 34,
        ord("\\"): 92,
        ord("a"): 7,
        ord("b"): 8,
        ord("f"): 12,
        ord("r"): 13,
        ord("v"): 11,
    }
    while i < len(data):
        c = data[i]
        if c == ord('"'):
            return out.decode("utf-8", "replace"), data[i + 1 :]
        if c == ord("\\") and i + 1 < len(data):
            nxt = data[i + 1]
            if nxt in escapes:
                out.append(escapes[nxt])
                i += 2
                continue
            if 48 <= nxt <= 55:
                out.append(int(data[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
        out.append(c)
        i += 1
    return out.decode("utf-8", "replace"), b""
