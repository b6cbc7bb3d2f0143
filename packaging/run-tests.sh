#!/usr/bin/env bash
# Run the whole camg test suite (unit, privileged, system, and the unit
# tier again on Python 3.12) as root on a Debian machine, installing what
# it needs first. Fails on any failure, including a tier that ran no test.
#
# With no arguments the tiers run in lanes at once (docs/testing.md says
# why three: on two cores the run is CPU-bound):
#   lane0..N-1  packaging/split_tests.py deals every module of the system,
#               privileged and unit tiers into $CAMG_TEST_LANES (default 3)
#               lanes of about equal recorded time; the unit share of a
#               lane runs in a PID namespace of its own
#   py312       beside them at a lower CPU weight: the unit tier's light
#               modules and the helper's exec module on the seed's Python 3.12
# The lanes keep out of each other's way the way parallel runs on a shared
# machine already must: every helper scope, cgroup and container a test
# makes is tagged with its pytest's pid, and the leak check ignores what
# another live run tagged (tests/privileged/conftest.py). Each tier's output
# is printed whole when it ends; the end is the ten slowest tests of all of
# them, every failed or errored test named, and one count line
# (packaging/ci_report.py). Logs and JUnit files:
# $CAMG_TEST_OUT (default .test-results/ in the checkout).
#
# With arguments, one pytest over tests/ gets them (e.g. a module or -k),
# in this shell, as before; CAMG_TEST_SERIAL=1 does the same with none.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
# .venv is made by the interpreter the services use (packaging/lib.sh
# camg_python), so every tier runs the code the way the services run it.
packaging/bootstrap.sh
export CAMG_CACHE="${CAMG_CACHE:-/var/cache/camg-test}"
# The container tests need a Docker engine: one is started unless one
# answers, and stopped afterwards if it was started here.
. packaging/dockerd.sh
camg_dockerd_start
trap camg_dockerd_stop EXIT
echo "run-tests.sh: $(.venv/bin/python -c 'import sys; print(sys.version.split()[0], sys._base_executable)')" >&2

if [ $# -gt 0 ] || [ "${CAMG_TEST_SERIAL:-}" = 1 ]; then
    set +e
    .venv/bin/pytest tests -p no:cacheprovider "$@"
    status=$?
    set -e
    [ "$status" = 5 ] && { echo "run-tests.sh: pytest collected no tests: failing" >&2; exit 1; }
    exit "$status"
fi

out="${CAMG_TEST_OUT:-$here/.test-results}"
rm -rf "$out"
mkdir -p "$out"

# tier NAME CMD...: run one pytest tier, its output to $out/NAME.log and
# JUnit to $out/NAME.xml; its status and wall seconds to $out/NAME.rc; its
# log printed whole (one tier at a time) when it ends.
tier() {
    local name=$1 start=$SECONDS rc
    shift
    echo "run-tests.sh: [$((SECONDS))s] $name: started" >&2
    set +e
    "$@" -p no:cacheprovider --junitxml="$out/$name.xml" >"$out/$name.log" 2>&1
    rc=$?
    set -e
    # pytest's 5 is "no tests ran": a failure, unless every test the lane
    # was dealt is one the run leaves out (marked full).
    if [ "$rc" = 5 ]; then
        if grep -Eq '^collected ([0-9]+) items? / \1 deselected / 0 selected' "$out/$name.log"; then
            rc=0
        else
            echo "run-tests.sh: $name collected no tests: failing" >>"$out/$name.log"
            rc=1
        fi
    fi
    echo "$rc $((SECONDS - start))" >"$out/$name.rc"
    {
        flock 9
        echo "================ $name: exit $rc after $((SECONDS - start)) s ================"
        cat "$out/$name.log"
    } 9>"$out/print.lock"
    echo "run-tests.sh: [$((SECONDS))s] $name: exit $rc after $((SECONDS - start)) s" >&2
}

# The seed's Python 3.12: the unit tier's light modules again (recorded
# under $CAMG_PY312_UNDER seconds, default 15: the heavy ones spend their
# time in the task suites, venvs and checkers they start, not in the
# interpreter), then one privileged module (the helper's exec), in a venv
# of their own ($CAMG_CACHE/venv-py3.12) where the machine has a 3.12 the
# service user can run. CAMG_PYTHON312 names one; a pyenv 3.12 under /root
# (which user camg cannot execute) is copied to /opt/camg-python3.12 for
# it. CAMG_SKIP_PY312=1 leaves the tier out. It runs beside the lanes at
# nice 10, so it takes what CPU the lanes leave.
py312_tier() {
    [ "${CAMG_SKIP_PY312:-}" = 1 ] && return 0
    . packaging/lib.sh
    local py312
    py312=$(camg_python312 || packaging/copy-python312.sh || true)
    if [ -z "$py312" ]; then
        echo "run-tests.sh: no Python 3.12 on this machine: the 3.12 tier is skipped" >&2
        return 0
    fi
    # In the build cache, not the checkout: a clean clone reuses it while
    # the lock is unchanged (bootstrap.sh's stamp); cold, it takes minutes.
    local venv312="$CAMG_CACHE/venv-py3.12"
    if ! CAMG_PYTHON=$py312 packaging/bootstrap.sh "$venv312" >"$out/py312-bootstrap.log" 2>&1; then
        cat "$out/py312-bootstrap.log"
        echo "1 0" >"$out/py312.rc"
        return 0
    fi
    local files
    mapfile -t files < <(.venv/bin/python packaging/split_tests.py --tier unit \
        --under "${CAMG_PY312_UNDER:-15}")
    tier py312 nice -n 10 unshare --pid --fork --mount-proc "$venv312/bin/python" \
        packaging/reaper.py "$venv312/bin/pytest" "${files[@]}" -q
    tier py312-helper nice -n 10 "$venv312/bin/pytest" tests/privileged/test_helper_exec.py -q
}

# The lanes: packaging/split_tests.py deals every module of the system,
# privileged and unit tiers into $CAMG_TEST_LANES lanes of about equal
# recorded time (each tier's .durations.json); a lane runs its share of each
# tier in turn, one pytest per tier. The unit share runs in a PID namespace
# of its own under a reaping PID 1 (packaging/reaper.py says why).
lanes=${CAMG_TEST_LANES:-3}
case $lanes in ''|*[!0-9]*|0) echo "run-tests.sh: CAMG_TEST_LANES must be a positive number" >&2; exit 2 ;; esac
.venv/bin/python packaging/split_tests.py --lanes "$lanes" --plan >&2
expected=()
lane() {
    local i=$1 tier files
    for tier in system privileged unit; do
        mapfile -t files < <(.venv/bin/python packaging/split_tests.py --lanes "$lanes" \
            --lane "$i" --tier "$tier")
        [ "${#files[@]}" = 0 ] && continue
        case $tier in
            unit) tier "lane$i-unit" unshare --pid --fork --mount-proc .venv/bin/python \
                      packaging/reaper.py .venv/bin/pytest "${files[@]}" ;;
            *) tier "lane$i-$tier" .venv/bin/pytest "${files[@]}" ;;
        esac
    done
}
pids=()
for ((i = 0; i < lanes; i++)); do
    for t in system privileged unit; do
        if [ -n "$(.venv/bin/python packaging/split_tests.py --lanes "$lanes" --lane "$i" --tier "$t")" ]; then
            expected+=("lane$i-$t")
        fi
    done
    lane "$i" &
    pids+=($!)
done
py312_tier &
pids+=($!)
wait "${pids[@]}" || true
echo "run-tests.sh: all lanes ended after $SECONDS s" >&2

status=0 reports=()
for name in "${expected[@]}" py312 py312-helper; do
    if [ ! -f "$out/$name.rc" ]; then
        case $name in py312*) continue ;; esac  # no 3.12 here, or CAMG_SKIP_PY312
        echo "run-tests.sh: $name did not run" >&2
        status=1
        continue
    fi
    read -r rc wall <"$out/$name.rc"
    [ "$rc" = 0 ] || status=1
    [ -f "$out/$name.xml" ] && reports+=("$name=$out/$name.xml:$wall")
done
.venv/bin/python packaging/ci_report.py "${reports[@]}" || status=1
exit "$status"
