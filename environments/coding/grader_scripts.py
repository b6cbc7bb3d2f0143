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
the end marker for integrity.py's cross-check (environments.coding.log_evaluation
grades the log).

The script reverts any change to a protected path (environments.coding.diff_paths)
that slipped through patch's fuzzier matching.
"""

from __future__ import annotations

import re
import secrets
import shlex

from camg.grading import guard_verdict
from environments.coding.diff_paths import PROTECTED_DIRS, PROTECTED_GLOBS, PROTECTED_NAMES
from environments.coding.profiles import Profile

# Scratch files of the grader scripts, in a directory of their own
# ($CAMG_GRADE_TMP, else /tmp/camg-grade in the sandbox; local runs get a
# private one, so concurrent local grades never share a file).
SCRATCH = '"$camg_tmp"'
DIFF_PATH = '"$camg_tmp/agent.diff"'
# Exit codes the script uses for its own (infrastructure) failures.
EXIT_SETUP = 90
EXIT_STATE = 91
EXIT_RUNNER = 92
GUARD_OUT = '"$camg_tmp/guard.jsonl"'
CHANGED_LIST = '"$camg_tmp/changed"'
#: where grader layers hold guard/camg_guard.py (root-owned)
GUARD_DIR = "/opt/camg-grader"
#: the guard's source (shared with General: camg.grading.guard_verdict)
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


# The follow-up scripts run in a fresh grader sandbox (the service never
# reuses the one the agent's code ran in), where no eval script recorded the
# untracked files: the tree is pristine, so what is untracked now is the
# image's. Run after an eval script on the same tree (local checks), the
# eval's record stands and ``pristine`` undoes the diff.
_BACK_TO_PRISTINE = f"""[ -e "$before" ] || git ls-files --others -z | sort -z > "$before" \
  || exit {EXIT_STATE}
pristine || exit {EXIT_STATE}
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
    """Run (in a fresh grader sandbox) after an eval script whose test
    command never started: start the runner on the pristine tree. Exit
    EXIT_RUNNER when it cannot start (the grader is broken), 0 when it can
    (the diff was)."""
    return (
        _preamble(profile, guard_dir, PROBE_KEYS)
        + _BACK_TO_PRISTINE
        + f""": > {CHANGED_LIST}
{_probe_lines(profile)}"""
    )


def eval_script(
    profile: Profile, tests_commit: str, guard_dir: str = GUARD_DIR, probe: bool = True
) -> str:
    """The bash script the grader sandbox runs; its stdin is
    ``script_stdin(new_keys(eval_keys(probe)), diff)``.

    The guard's keys arrive on stdin, never in the script text or an
    environment (which other processes can read from /proc). ``probe``:
    start the runner on the pristine tree before applying the diff (the
    service does it for the first grade of each task; later grades whose run
    never starts are probed afterwards with ``probe_script``).
    """
    protected_case = "|".join(
        [f"*/{d}/*" for d in PROTECTED_DIRS]
        + [f"*/{n}" for n in PROTECTED_NAMES]
        + [f"*/{g}" for g in PROTECTED_GLOBS]
    )
    start, end = ">>>>> Start Test Output", ">>>>> End Test Output"
    # A backslash ending a line below is Python's: it joins the two lines, so
    # the script keeps them as one.
    return (
        _preamble(profile, guard_dir, eval_keys(probe))
        + f"""cat > {DIFF_PATH} || exit {EXIT_SETUP}
head=$(git rev-parse HEAD) || exit {EXIT_STATE}
[ "$head" = {shlex.quote(tests_commit)} ] || \
{{ echo "camg: grader repo at $head"; exit {EXIT_STATE}; }}
# Untracked files before the diff is applied (an image's build artifacts can
# show through under /testbed): only files the diff creates are ever removed.
git ls-files --others -z | sort -z > "$before" || exit {EXIT_STATE}
: > {CHANGED_LIST}
{_probe_lines(profile) if probe else ""}protected() {{ case "/$1" in {protected_case}) \
return 0;; esac; return 1; }}
if [ -s {DIFF_PATH} ]; then
  applied=""
  for cmd in "git apply --verbose" "git apply --verbose --reject" \
"patch --batch --fuzz=5 -p1 -i"; do
    if $cmd {DIFF_PATH}; then applied="$cmd"; break; fi
    echo "camg: '$cmd' failed; trying the next method"
    pristine || exit {EXIT_STATE}
  done
  if [ -z "$applied" ]; then echo '>>>>> Patch Apply Failed'; exit 0; fi
  echo ">>>>> Applied Patch ($applied)"
fi
git diff --name-only -z HEAD | while IFS= read -r -d '' f; do
  if protected "$f"; then echo "camg: reverting $f"; \
git checkout -q HEAD -- "$f" || exit {EXIT_STATE}; fi
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
    )


def collect_script(profile: Profile, guard_dir: str = GUARD_DIR) -> str:
    """Run (in a fresh grader sandbox) after an eval script that collected
    none of the listed tests: collect only, on the pristine tree. Tells an
    agent that broke collection (0.0) from a grader that cannot collect the
    listed tests at all (GraderError)."""
    return (
        _preamble(profile, guard_dir, COLLECT_KEYS)
        + _BACK_TO_PRISTINE
        + f""": > {CHANGED_LIST}
export PYTEST_ADDOPTS="$base_addopts --collect-only -q"
rm -f {GUARD_OUT}
{profile.test_cmd} > "$camg_tmp/collect.log" 2>&1
echo "camg: collect-only exit $?"
tail -c 2000 "$camg_tmp/collect.log"
show_channel
"""
    )
