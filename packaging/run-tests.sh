#!/usr/bin/env bash
# Run the whole camg test suite (unit, privileged, system) as root on a
# Debian machine, installing what it needs first. Extra arguments go to
# pytest. Fails on any failure, including "no tests ran".
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
set +e
.venv/bin/pytest tests -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" = 5 ]; then
    echo "run-tests.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"
