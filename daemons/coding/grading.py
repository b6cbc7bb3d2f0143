"""SWE-smith's evaluation procedure, as a script for a fresh grader sandbox.

The grader layer's /testbed is already the task branch at HEAD~1 (the
"Bug Patch" commit: the bug, with the FAIL_TO_PASS tests restored). The
script applies the agent's diff the way SWE-smith does (git apply, then
--reject, then patch --fuzz, each from a clean tree), reverts every change
to tests and to whatever decides test collection, and runs the profile's
test command between swebench's start/end markers under ``set -x``. The log
is parsed on the service side by the installed swebench (get_logs_eval,
get_eval_tests_report, get_resolution_status) through swebench_shim.

Before the diff is applied the test command is started once on the pristine
tree with the grader's guard plugin in probe mode (a runner that cannot
start is a GraderError, never a 0.0); the graded run has the guard loaded
first and plugin autoloading off, and its signed channel is printed after
the end marker for integrity.py's cross-check.

The agent's diff is filtered twice: test files are dropped from it before it
is applied (so recreating a test file the agent never saw cannot make the
whole diff fail), and the script reverts anything that slipped through
patch's fuzzier matching.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import secrets
import shlex
import tempfile

from camg import guard_verdict
from camg.errors import GraderError

from daemons.coding.profiles import SWEBENCH_VERSION, Profile
from daemons.coding.rows import Row

# Scratch files of the grader scripts, in a directory of their own
# ($CAMG_GRADE_TMP, else /tmp/camg-grade in the sandbox; local runs get a
# private one, so concurrent local grades never share a file).
SCRATCH = '"$camg_tmp"'
DIFF_PATH = '"$camg_tmp/agent.diff"'
# Exit codes the script uses for its own (infrastructure) failures.
EXIT_SETUP = 90
EXIT_STATE = 91

# Paths whose changes never count: tests, and files that change what pytest
# collects or how Python starts (a sitecustomize or .pth runs before any test).
_PROTECTED_DIRS = ("test", "tests", "testing")
_PROTECTED_NAMES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                    ".pytest.ini", "pytest.toml", ".pytest.toml", "noxfile.py",
                    "sitecustomize.py", "usercustomize.py")
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


def split_sections(diff: bytes) -> list[bytes]:
    """The ``diff --git`` file sections of ``diff``, in order."""
    starts = [m.start() for m in _SECTION.finditer(diff)]
    return [diff[b:e] for b, e in zip(starts, starts[1:] + [len(diff)])]


def filter_diff(diff: bytes) -> tuple[bytes, list[str]]:
    """Drop every file section of ``diff`` that touches a protected path."""
    starts = [m.start() for m in _SECTION.finditer(diff)]
    if not starts:
        return b"", []
    kept, dropped = [diff[:starts[0]]] if starts[0] else [], []
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

EXIT_RUNNER = 92
GUARD_OUT = '"$camg_tmp/guard.jsonl"'
CHANGED_LIST = '"$camg_tmp/changed"'
#: where grader layers hold guard/camg_guard.py (root-owned)
GUARD_DIR = "/opt/camg-grader"
#: the guard's source (shared with General: camg.guard_verdict)
GUARD_SOURCE = guard_verdict.GUARD_DIR


#: the guard's keys, one file each, as the scripts copy them off their stdin
KEYS_DIR = '"$camg_tmp/keys"'
#: a key as it arrives on a script's stdin: 64 hex digits and a newline
KEY_LINE = 65
#: guard sessions (so keys) of each script: the eval script's pristine probe
#: and its run, or the run alone; probe_script and collect_script one each
PROBE_KEYS = 1
COLLECT_KEYS = 1


def eval_keys(probe: bool) -> int:
    return 2 if probe else 1


def new_keys(count: int) -> list[bytes]:
    """Fresh guard keys for one script run (what ``script_stdin`` sends)."""
    return [secrets.token_hex(32).encode() for _ in range(count)]


def script_stdin(keys: list[bytes], diff: bytes = b"") -> bytes:
    """A grader script's stdin: its keys, one line each, then the diff."""
    if any(len(k) != KEY_LINE - 1 or not re.fullmatch(rb"[0-9a-f]+", k) for k in keys):
        raise ValueError("a guard key is 64 hex digits")
    return b"".join(k + b"\n" for k in keys) + diff


def _preamble(profile: Profile, guard_dir: str, keys: int) -> str:
    """Shell shared by the eval and pristine-collection scripts.

    Git runs with no system/global configuration, no hooks, no fsmonitor,
    no filters from the repository's attributes. The test command gets the
    grader's plugin first (-p camg_guard from ``guard_dir``) and plugin
    autoloading off; the guard restores the variables it changed for any
    child process.

    The script's stdin starts with ``keys`` guard keys: each is copied to a
    file of its own in a 0700 directory by dd, which reads exactly one line
    off the pipe (``head -c`` may read ahead; bash's ``read`` would leave the
    key in this shell's memory, which the test uid can read in /proc). Each
    guard session claims one file and removes it; the key never enters an
    environment (/proc/<pid>/environ of every process of the test uid is
    readable to the others).
    """
    workdir = shlex.quote(profile.workdir)
    return f"""#!/bin/bash
exec 2>&1
set -uo pipefail
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1
git() {{ command git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false \
  -c core.attributesFile=/dev/null -c diff.external= "$@"; }}
cd {workdir} || exit {EXIT_SETUP}
camg_tmp="${{CAMG_GRADE_TMP:-/tmp/camg-grade}}"
mkdir -p "$camg_tmp" || exit {EXIT_SETUP}
rm -rf {KEYS_DIR} && mkdir -m 700 {KEYS_DIR} || exit {EXIT_SETUP}
for camg_i in {" ".join(str(i) for i in range(keys))}; do
  ( umask 077; dd of={KEYS_DIR}/"$camg_i" bs={KEY_LINE} count=1 iflag=fullblock status=none ) \
    || exit {EXIT_SETUP}
  [ "$(stat -c %s {KEYS_DIR}/"$camg_i")" = {KEY_LINE} ] || exit {EXIT_SETUP}
done
export CAMG_GUARD_KEYS={KEYS_DIR}
orig() {{ if [ -n "${{!1+x}}" ]; then printf '%s' "${{!1}}"; else printf 'camg:unset'; fi; }}
export CAMG_GUARD_ORIG_PYTEST_ADDOPTS="$(orig PYTEST_ADDOPTS)"
export CAMG_GUARD_ORIG_PYTEST_DISABLE_PLUGIN_AUTOLOAD="$(orig PYTEST_DISABLE_PLUGIN_AUTOLOAD)"
export CAMG_GUARD_ORIG_PYTHONPATH="$(orig PYTHONPATH)"
base_addopts="-p {GUARD_MODULE_NAME}${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}"
export PYTEST_ADDOPTS="$base_addopts" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export PYTHONPATH={shlex.quote(guard_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"
export CAMG_GUARD_WORKDIR={workdir} CAMG_GUARD_OUT={GUARD_OUT} CAMG_GUARD_CHANGED={CHANGED_LIST}
before="$camg_tmp/untracked-before"
created() {{ git ls-files --others -z | sort -z | comm -z -13 "$before" -; }}
pristine() {{
  git checkout -q -f HEAD -- . || return 1
  created | xargs -0 -r rm -f -- || return 1
}}
show_channel() {{ echo; cat {GUARD_OUT} 2>/dev/null; rm -f {GUARD_OUT}; }}
"""


GUARD_MODULE_NAME = guard_verdict.GUARD_MODULE


def _probe_lines(profile: Profile) -> str:
    # The grader's own environment, on the pristine tree: the test command's
    # interpreter and runner must start (the guard answers and exits).
    return f"""rm -f {GUARD_OUT}
( export CAMG_GUARD_MODE=probe; {profile.test_cmd} ) > "$camg_tmp/probe.log" 2>&1
probe=$?
if [ $probe -ne 0 ] || ! grep -q '"t":"hello"' {GUARD_OUT} 2>/dev/null; then
  echo "camg: the test command did not start on the pristine tree (exit $probe)"
  tail -c 3000 "$camg_tmp/probe.log"
  exit {EXIT_RUNNER}
fi
show_channel
"""


def probe_script(profile: Profile, guard_dir: str = GUARD_DIR) -> str:
    """Run after an eval script whose test command never started: back to
    the pristine tree, start the runner there. Exit EXIT_RUNNER when it
    cannot start (the grader is broken), 0 when it can (the diff was)."""
    return _preamble(profile, guard_dir, PROBE_KEYS) + f"""pristine || exit {EXIT_STATE}
: > {CHANGED_LIST}
{_probe_lines(profile)}"""


def eval_script(profile: Profile, tests_commit: str, guard_dir: str = GUARD_DIR,
                probe: bool = True) -> str:
    """The bash script the grader sandbox runs; its stdin is
    ``script_stdin(new_keys(eval_keys(probe)), diff)``.

    The guard's keys arrive on stdin, never in the script text or an
    environment (which other processes can read from /proc). ``probe``:
    start the runner on the pristine tree before applying the diff (the
    service does it for the first grade of each task; later grades whose run
    never starts are probed afterwards with ``probe_script``).
    """
    protected_case = "|".join(
        [f"*/{d}/*" for d in _PROTECTED_DIRS]
        + [f"*/{n}" for n in _PROTECTED_NAMES]
        + [f"*/{g}" for g in _PROTECTED_GLOBS])
    start, end = ">>>>> Start Test Output", ">>>>> End Test Output"
    return _preamble(profile, guard_dir, eval_keys(probe)) + f"""cat > {DIFF_PATH} || exit {EXIT_SETUP}
head=$(git rev-parse HEAD) || exit {EXIT_STATE}
[ "$head" = {shlex.quote(tests_commit)} ] || {{ echo "camg: grader repo at $head"; exit {EXIT_STATE}; }}
# Untracked files before the diff is applied (an image's build artifacts can
# show through under /testbed): only files the diff creates are ever removed.
git ls-files --others -z | sort -z > "$before" || exit {EXIT_STATE}
: > {CHANGED_LIST}
{_probe_lines(profile) if probe else ""}protected() {{ case "/$1" in {protected_case}) return 0;; esac; return 1; }}
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
{{ git diff --name-only -z HEAD; created; }} > {CHANGED_LIST} || exit {EXIT_STATE}
set -x
: '{start}'
{profile.test_cmd}
rc=$?
: '{end}'
{{ set +x; }} 2>/dev/null
show_channel
# The test command's own status is the script's (the agent's code cannot
# forge a process's exit status the way it can print lines); never one of
# the grader's own codes.
if [ $rc -ge {EXIT_SETUP} ] && [ $rc -le {EXIT_RUNNER} ]; then rc=1; fi
exit $rc
"""


def collect_script(profile: Profile, guard_dir: str = GUARD_DIR) -> str:
    """Run after an eval script in the same sandbox: back to the pristine
    tree, collect only. Tells an agent that broke collection (0.0) from a
    grader that cannot collect the listed tests at all (GraderError)."""
    return _preamble(profile, guard_dir, COLLECT_KEYS) + f"""pristine || exit {EXIT_STATE}
: > {CHANGED_LIST}
export PYTEST_ADDOPTS="$base_addopts --collect-only -q"
rm -f {GUARD_OUT}
{profile.test_cmd} > "$camg_tmp/collect.log" 2>&1
echo "camg: collect-only exit $?"
tail -c 2000 "$camg_tmp/collect.log"
show_channel
"""


# --- parsing with swebench ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Report:
    resolved: bool
    reason: str                       # resolved, tests_failed, patch_apply_failed, ...
    fail_to_pass_failed: tuple[str, ...] = ()
    pass_to_pass_failed: tuple[str, ...] = ()
    dropped_paths: tuple[str, ...] = ()
    integrity: str = "ok"             # "ok" or "tampered"
    evidence: tuple[dict, ...] = ()   # {rule, path, detail} per finding
    none_collected: bool = False      # the run collected none of the listed tests
    runner_started: bool = True       # the guard answered in the graded run

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved and self.integrity == "ok" else 0.0

    def outcome(self) -> dict:
        body = {"integrity": self.integrity, "grade_reason": self.reason}
        if self.evidence:
            body["integrity_evidence"] = list(self.evidence)
        return body


def preload() -> None:
    """Import swebench's grading now (about a second), not in the first grade."""
    import swebench.harness.grading  # noqa: F401
    import swebench.harness.test_spec.test_spec  # noqa: F401


def evaluate(log: str, row: Row, *, exit_code: int, timed_out: bool, keys: list[bytes],
             dropped: list[str] | tuple[str, ...] = (), findings=()) -> Report:
    """Grade one eval-script run; GraderError when no honest grade exists.

    ``findings`` are the diff screen's (integrity.screen); the guard's
    channel in ``log`` is checked against swebench's parse of the log.
    """
    from swebench.harness.constants import (APPLY_PATCH_FAIL, END_TEST_OUTPUT, FAIL_TO_PASS,
                                            PASS_TO_PASS, START_TEST_OUTPUT, ResolvedStatus)
    from swebench.harness.grading import (get_eval_tests_report, get_logs_eval,
                                          get_resolution_status)
    from swebench.harness.test_spec.test_spec import TestSpec

    from daemons.coding import integrity

    dropped = tuple(dropped)
    findings = list(findings)
    listed = list(row.fail_to_pass) + list(row.pass_to_pass)

    def done(resolved, reason, f2p=(), p2p=(), none_collected=False, started=True):
        unique = dict.fromkeys(json.dumps(f.to_data(), sort_keys=True) for f in findings)
        if findings:
            # What the tests did no longer matters: the grade is the tampering.
            resolved, reason = False, "tampered"
        return Report(resolved, reason, tuple(f2p), tuple(p2p), dropped,
                      "tampered" if findings else "ok",
                      tuple(json.loads(u) for u in unique), none_collected, started)

    if exit_code == EXIT_RUNNER and not timed_out:
        raise GraderError(f"the grader's test command cannot start: {log[-2000:]}")
    if exit_code in (EXIT_SETUP, EXIT_STATE) and not timed_out:
        raise GraderError(f"grader sandbox setup failed (exit {exit_code}): {log[-2000:]}")
    # The whole log's channel (the pristine probe's session included).
    findings += guard_verdict.channel_findings(integrity.read_channel(log, keys))
    if APPLY_PATCH_FAIL in log and START_TEST_OUTPUT not in log:
        return done(False, "patch_apply_failed")
    if timed_out:
        # SWE-smith: a test run that times out is not resolved.
        return done(False, "tests_timed_out")
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        raise GraderError(f"grader log lacks the test output markers (exit {exit_code}): "
                          f"{log[-2000:]}")
    test_part = log[log.index(START_TEST_OUTPUT):]
    run = integrity.read_channel(test_part, keys)
    started = bool(run.hello)
    spec = TestSpec(instance_id=row.instance_id, repo=row.repo, version=SWEBENCH_VERSION,
                    repo_script_list=[], eval_script_list=[], env_script_list=[],
                    arch="x86_64", FAIL_TO_PASS=list(row.fail_to_pass),
                    PASS_TO_PASS=list(row.pass_to_pass), language="py", docker_specs={},
                    namespace=None)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".log") as handle:
        handle.write(integrity.strip_channel(log))
        handle.flush()
        status_map, found = get_logs_eval(spec, handle.name)
    section = test_part[:test_part.index(END_TEST_OUTPUT)] if END_TEST_OUTPUT in test_part \
        else test_part
    findings += [f for f in integrity.cross_check(run, status_map if found else {}, listed,
                                                  exit_code, timed_out, section)
                 if f.rule not in guard_verdict.CHANNEL_RULES]
    none_collected = bool(run.hello) and not (run.collected or set()) & set(listed)
    if not started:
        # The caller probes the pristine tree: GraderError if the runner
        # cannot start there either, else this 0.0 stands.
        return done(False, "runner_did_not_start", started=False)
    if not found:
        return done(False, "no_test_output", none_collected=none_collected)
    report = get_eval_tests_report(status_map, {FAIL_TO_PASS: list(row.fail_to_pass),
                                                PASS_TO_PASS: list(row.pass_to_pass)})
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    if resolved and not integrity.all_passed(run, listed):
        resolved = False
    return done(resolved, "resolved" if resolved else "tests_failed",
                report[FAIL_TO_PASS]["failure"], report[PASS_TO_PASS]["failure"],
                none_collected)


def require_collectable(log: str, keys: list[bytes], row: Row) -> None:
    """After collect_script: GraderError unless the pristine tree collects
    at least one listed test (else a 0.0 would blame the agent for the
    grader's environment)."""
    from daemons.coding import integrity
    channel = integrity.read_channel(log, keys)
    if not channel.hello:
        raise GraderError(f"pristine collection did not start the runner: {log[-2000:]}")
    listed = set(row.fail_to_pass) | set(row.pass_to_pass)
    if not (channel.collected or set()) & listed:
        raise GraderError("the grader's test command collects none of the task's tests on "
                          f"the pristine tree: {log[-2000:]}")


def local_eval(script: str, diff: bytes, cwd: str, timeout: float,
               keys: list[bytes]) -> tuple[str, int, bool]:
    """Run a grader script on a local checkout (builder and unit tests only),
    ``keys`` (as many as the script takes) and ``diff`` on its stdin."""
    import subprocess
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST", "CAMG_GUARD"))}
    env["CAMG_GRADE_TMP"] = os.path.join(os.path.dirname(os.path.abspath(cwd)),
                                         ".camg-grade-" + os.path.basename(cwd))
    try:
        proc = subprocess.run(["bash", "-c", script], input=script_stdin(keys, diff), cwd=cwd,
                              env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"").decode("utf-8", "replace"), -1, True
    return proc.stdout.decode("utf-8", "replace"), proc.returncode, False
