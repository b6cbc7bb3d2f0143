"""SWE-smith's evaluation procedure, as a script for a fresh grader sandbox.

The grader layer's /testbed is already the task branch at HEAD~1 (the
"Bug Patch" commit: the bug, with the FAIL_TO_PASS tests restored). The
script applies the agent's diff the way SWE-smith does (git apply, then
--reject, then patch --fuzz, each from a clean tree), reverts every change
to tests and to whatever decides test collection, and runs the profile's
test command between swebench's start/end markers under ``set -x``. The log
is parsed on the service side by the installed swebench (get_logs_eval,
get_eval_tests_report, get_resolution_status) through swebench_shim.

The agent's diff is filtered twice: test files are dropped from it before it
is applied (so recreating a test file the agent never saw cannot make the
whole diff fail), and the script reverts anything that slipped through
patch's fuzzier matching.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import shlex
import tempfile

from camg.errors import GraderError

from daemons.coding.profiles import SWEBENCH_VERSION, Profile
from daemons.coding.rows import Row

DIFF_PATH = "/tmp/camg-agent.diff"
# Exit codes the script uses for its own (infrastructure) failures.
EXIT_SETUP = 90
EXIT_STATE = 91

# Paths whose changes never count: tests, and files that change what pytest
# collects or how Python starts (a sitecustomize or .pth runs before any test).
_PROTECTED_DIRS = ("test", "tests", "testing")
_PROTECTED_NAMES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                    ".pytest.ini", "noxfile.py", "sitecustomize.py", "usercustomize.py")
_PROTECTED_GLOBS = ("test_*.py", "*_test.py", "*.pth")
# Build and cache artifacts the agent's test runs leave behind; never a fix.
DIFF_EXCLUDES = ("**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**", "**/*.egg-info/**")


def is_protected(path: str) -> bool:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return False
    if any(part in _PROTECTED_DIRS for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in _PROTECTED_NAMES or any(fnmatch.fnmatchcase(name, g) for g in _PROTECTED_GLOBS)


# --- the agent's diff -------------------------------------------------------

def diff_command(snapshot: str, private_git: str = "/var/lib/camg-task/git",
                 workdir: str = "/testbed") -> str:
    """Shell command (run as root in the agent's sandbox) printing its diff.

    Uses the root-only copy of the workspace's git directory, so whatever
    the agent did to /testbed/.git is irrelevant. Special files (fifos,
    sockets, devices) cannot be part of a diff and would make ``git add``
    fail, so they are removed first.
    """
    git = ("GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent "
           f"git --git-dir={shlex.quote(private_git)} --work-tree={shlex.quote(workdir)} "
           "-c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -c core.untrackedCache=false "
           "-c core.checkStat=minimal -c core.trustctime=false")
    excludes = " ".join(shlex.quote(f":(exclude,glob){g}") for g in DIFF_EXCLUDES)
    return (f"set -e; cd {shlex.quote(workdir)}; "
            f"find . -path ./.git -prune -o ! -type f ! -type d ! -type l -print0 "
            f"| xargs -0 -r rm -f --; "
            f"{git} add -A -- . {excludes}; "
            f"{git} diff --cached --binary --full-index --no-color --no-ext-diff "
            f"--no-textconv --no-renames {snapshot}")


_SECTION = re.compile(rb"^diff --git ", re.M)
_PATH_LINES = (b"--- ", b"+++ ", b"rename from ", b"rename to ", b"copy from ", b"copy to ")


def filter_diff(diff: bytes) -> tuple[bytes, list[str]]:
    """Drop every file section of ``diff`` that touches a protected path."""
    starts = [m.start() for m in _SECTION.finditer(diff)]
    if not starts:
        return b"", []
    kept, dropped = [diff[:starts[0]]] if starts[0] else [], []
    for begin, end in zip(starts, starts[1:] + [len(diff)]):
        section = diff[begin:end]
        paths = _section_paths(section)
        touched = [p for p in paths if is_protected(p)]
        if touched:
            dropped.append(touched[0])
        else:
            kept.append(section)
    return b"".join(kept), dropped


def _section_paths(section: bytes) -> list[str]:
    lines = section.split(b"\n")
    header = lines[0][len(b"diff --git "):]
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
                value = line[len(prefix):].split(b"\t")[0]
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
    escapes = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7,
               ord("b"): 8, ord("f"): 12, ord("r"): 13, ord("v"): 11}
    while i < len(data):
        c = data[i]
        if c == ord('"'):
            return out.decode("utf-8", "replace"), data[i + 1:]
        if c == ord("\\") and i + 1 < len(data):
            nxt = data[i + 1]
            if nxt in escapes:
                out.append(escapes[nxt])
                i += 2
                continue
            if 48 <= nxt <= 55:
                out.append(int(data[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
        out.append(c)
        i += 1
    return out.decode("utf-8", "replace"), b""


# --- the evaluation script ----------------------------------------------------

def eval_script(profile: Profile, tests_commit: str) -> str:
    """The bash script the grader sandbox runs; the diff arrives on stdin."""
    protected_case = "|".join(
        [f"*/{d}/*" for d in _PROTECTED_DIRS]
        + [f"*/{n}" for n in _PROTECTED_NAMES]
        + [f"*/{g}" for g in _PROTECTED_GLOBS])
    start, end = ">>>>> Start Test Output", ">>>>> End Test Output"
    return f"""#!/bin/bash
exec 2>&1
set -uo pipefail
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
git() {{ command git -c safe.directory='*' -c core.hooksPath=/dev/null "$@"; }}
cd {shlex.quote(profile.workdir)} || exit {EXIT_SETUP}
cat > {DIFF_PATH} || exit {EXIT_SETUP}
head=$(git rev-parse HEAD) || exit {EXIT_STATE}
[ "$head" = {shlex.quote(tests_commit)} ] || {{ echo "camg: grader repo at $head"; exit {EXIT_STATE}; }}
# Untracked files before the diff is applied (an image's build artifacts can
# show through under /testbed): only files the diff creates are ever removed.
before=/tmp/camg-untracked-before
git ls-files --others -z | sort -z > "$before" || exit {EXIT_STATE}
created() {{ git ls-files --others -z | sort -z | comm -z -13 "$before" -; }}
pristine() {{
  git checkout -q -f HEAD -- . || return 1
  created | xargs -0 -r rm -f -- || return 1
}}
protected() {{ case "/$1" in {protected_case}) return 0;; esac; return 1; }}
if [ -s {DIFF_PATH} ]; then
  applied=""
  for cmd in "git apply --verbose" "git apply --verbose --reject" "patch --batch --fuzz=5 -p1 -i"; do
    if $cmd {DIFF_PATH}; then applied="$cmd"; break; fi
    echo "camg: '$cmd' failed; trying the next method"
    pristine || exit {EXIT_STATE}
  done
  if [ -z "$applied" ]; then echo '>>>>> Patch Apply Failed'; exit 0; fi
  echo ">>>>> Applied Patch ($applied)"
fi
git diff --name-only -z HEAD | while IFS= read -r -d '' f; do
  if protected "$f"; then echo "camg: reverting $f"; git checkout -q HEAD -- "$f" || exit {EXIT_STATE}; fi
done || exit {EXIT_STATE}
created | while IFS= read -r -d '' f; do
  case "$f" in *.rej|*.orig) rm -f -- "$f"; continue;; esac
  if protected "$f"; then echo "camg: removing $f"; rm -f -- "$f"; fi
done || exit {EXIT_STATE}
set -x
: '{start}'
{profile.test_cmd}
: '{end}'
"""


# --- parsing with swebench ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Report:
    resolved: bool
    reason: str                       # resolved, tests_failed, patch_apply_failed, ...
    fail_to_pass_failed: tuple[str, ...] = ()
    pass_to_pass_failed: tuple[str, ...] = ()
    dropped_paths: tuple[str, ...] = ()

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def preload() -> None:
    """Import swebench's grading now (about a second), not in the first grade."""
    import swebench.harness.grading  # noqa: F401
    import swebench.harness.test_spec.test_spec  # noqa: F401


def evaluate(log: str, row: Row, *, exit_code: int, timed_out: bool,
             dropped: list[str] | tuple[str, ...] = ()) -> Report:
    """Grade one eval-script run; GraderError when no honest grade exists."""
    from swebench.harness.constants import (APPLY_PATCH_FAIL, END_TEST_OUTPUT, FAIL_TO_PASS,
                                            PASS_TO_PASS, START_TEST_OUTPUT, ResolvedStatus)
    from swebench.harness.grading import (get_eval_tests_report, get_logs_eval,
                                          get_resolution_status)
    from swebench.harness.test_spec.test_spec import TestSpec

    dropped = tuple(dropped)
    if exit_code in (EXIT_SETUP, EXIT_STATE) and not timed_out:
        raise GraderError(f"grader sandbox setup failed (exit {exit_code}): {log[-2000:]}")
    if APPLY_PATCH_FAIL in log and START_TEST_OUTPUT not in log:
        return Report(False, "patch_apply_failed", dropped_paths=dropped)
    if timed_out:
        # SWE-smith: a test run that times out is not resolved.
        return Report(False, "tests_timed_out", dropped_paths=dropped)
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        raise GraderError(f"grader log lacks the test output markers (exit {exit_code}): "
                          f"{log[-2000:]}")
    spec = TestSpec(instance_id=row.instance_id, repo=row.repo, version=SWEBENCH_VERSION,
                    repo_script_list=[], eval_script_list=[], env_script_list=[],
                    arch="x86_64", FAIL_TO_PASS=list(row.fail_to_pass),
                    PASS_TO_PASS=list(row.pass_to_pass), language="py", docker_specs={},
                    namespace=None)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".log") as handle:
        handle.write(log)
        handle.flush()
        status_map, found = get_logs_eval(spec, handle.name)
    if not found:
        return Report(False, "no_test_output", dropped_paths=dropped)
    report = get_eval_tests_report(status_map, {FAIL_TO_PASS: list(row.fail_to_pass),
                                                PASS_TO_PASS: list(row.pass_to_pass)})
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    return Report(resolved, "resolved" if resolved else "tests_failed",
                  tuple(report[FAIL_TO_PASS]["failure"]), tuple(report[PASS_TO_PASS]["failure"]),
                  dropped)


def local_eval(script: str, diff: bytes, cwd: str, timeout: float) -> tuple[str, int, bool]:
    """Run the eval script on a local checkout (builder and unit tests only)."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    try:
        proc = subprocess.run(["bash", "-c", script], input=diff, cwd=cwd, env=env,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"").decode("utf-8", "replace"), -1, True
    return proc.stdout.decode("utf-8", "replace"), proc.returncode, False
