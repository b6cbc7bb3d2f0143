#!/usr/bin/env bash
# Install what camg needs on a Debian machine (root): the Debian packages
# listed under packaging/apt/, and a virtualenv with the pinned runtime lock
# plus the project. Idempotent; used by the demo, the tests and CI.
#
#   packaging/bootstrap.sh [VENV]      (default: ./.venv of the checkout)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$here/.venv}"

CAMG_LOG_TAG=bootstrap.sh
# shellcheck source=packaging/lib.sh
. "$here/packaging/lib.sh"
[ "$(id -u)" = 0 ] || camg_die "run as root (it installs Debian packages)"

camg_install_apt "$here"
# The interpreter the services use (packaging/lib.sh camg_python): the
# tests run the code the way the services run it.
python=$(camg_python)
camg_venv "$venv" "$python"
# Only reinstall when the lock changed: a warm venv costs nothing.
stamp="$venv/.camg-lock.sha256"
want="$(sha256sum < "$here/requirements.lock" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    camg_install_lock "$venv" "$here/requirements.lock"
    camg_pip_check "$venv"
    echo "$want" > "$stamp"
fi
camg_pip "$venv" install -q --no-deps -e "$here" -e "$here/third_party/swebench_shim"
echo "bootstrap.sh: ready ($venv, $("$venv/bin/python" -V 2>&1) from $python)"
