#!/usr/bin/env bash
# Regenerate requirements.lock (and its copy requirements-environments.txt)
# from requirements/*.in, with PyPI as the only package source, and prove
# the result installs on every supported interpreter.
#
#   packaging/lock.sh [--upgrade]
#
# One lock serves Python 3.11 and 3.12: it is resolved on the oldest
# interpreter the suite supports (Debian bookworm's /usr/bin/python3,
# 3.11.2, so a release needing a newer 3.11 — soupsieve 3.x wants 3.11.5 —
# is never chosen), then installed --no-deps and `pip check`ed on each
# interpreter of $CAMG_LOCK_PYTHONS (default: that one and a 3.12 from
# packaging/lib.sh camg_python312). Without --upgrade the current lock
# constrains the resolution, so only what the .in files changed moves.
#
# pyserini (requirements/nodeps.in) is installed --no-deps: its declared
# requirements are its dense-retrieval stack (transformers, onnxruntime,
# nmslib, ...), which Shop's BM25 search never imports (environments/shop/search.py).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
CAMG_LOG_TAG=lock.sh
# shellcheck source=packaging/lib.sh
. "$here/packaging/lib.sh"

upgrade=
[ "${1:-}" = --upgrade ] && upgrade=1
base=${CAMG_LOCK_BASE_PYTHON:-/usr/bin/python3}
pythons=${CAMG_LOCK_PYTHONS:-"$base $(camg_python312 || true)"}
work=$(mktemp -d /tmp/camg-lock.XXXXXX)
trap 'rm -rf "$work"' EXIT

ins=()
for name in base coding general visual shop autoresearch helper test; do
    ins+=(-r "$here/requirements/$name.in")
done
constraints=()
if [ -z "$upgrade" ]; then
    # What nodeps.in pins itself is not held at its old pin.
    grep -v '^#' "$here/requirements.lock" \
        | grep -viE "^($(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' "$here/requirements/nodeps.in" | paste -sd'|'))==" \
        > "$work/constraints.txt"
    constraints=(-c "$work/constraints.txt")
fi

camg_log "resolving on $base ($("$base" -V 2>&1)), PyPI only"
"$base" -m venv "$work/resolve"
camg_pypi_pip "$work/resolve" install -q "${ins[@]}" "${constraints[@]}"
camg_pypi_pip "$work/resolve" install -q --no-deps -r "$here/requirements/nodeps.in" "${constraints[@]}"
{
    cat "$here/requirements/lock-header.txt"
    "$work/resolve/bin/python" -m pip --disable-pip-version-check freeze --exclude-editable --all \
        | grep -Ev '^(pip|setuptools|wheel)=='
} > "$work/requirements.lock"

for py in $pythons; do
    camg_log "installing the lock on $py ($("$py" -V 2>&1)), PyPI only"
    rm -rf "$work/check"
    "$py" -m venv "$work/check"
    camg_pypi_pip "$work/check" install -q --no-deps -r "$work/requirements.lock"
    camg_pip_check "$work/check"
done
cp "$work/requirements.lock" "$here/requirements.lock"
cp "$work/requirements.lock" "$here/requirements-environments.txt"
camg_log "requirements.lock: $(grep -cv '^#' "$here/requirements.lock") pins, checked on: $pythons"
