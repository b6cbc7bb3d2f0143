#!/usr/bin/env bash
# Install what camg needs on a Debian machine (root): the Debian packages
# listed under packaging/apt/, and a virtualenv with the pinned runtime lock
# plus the project. Idempotent; used by the demo, the tests and CI.
#
#   packaging/bootstrap.sh [VENV]      (default: ./.venv of the checkout)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$here/.venv}"

if [ "$(id -u)" != 0 ]; then
    echo "bootstrap.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

mapfile -t packages < <(cat "$here"/packaging/apt/*.txt | sed -e 's/#.*//' -e 's/[[:space:]]//g' | grep -v '^$' | sort -u)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bootstrap.sh: installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Some machines' pip configuration names local index folders that do not
# exist; pip warns once per package about each. Keep real errors visible.
pip() { "$venv/bin/pip" --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# Only reinstall when the lock changed: a warm venv costs nothing.
stamp="$venv/.camg-lock.sha256"
want="$(sha256sum "$here/requirements.lock" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    pip install -q --upgrade pip
    pip install -q -r "$here/requirements.lock"
    echo "$want" > "$stamp"
fi
pip install -q --no-deps --no-build-isolation -e "$here" -e "$here/third_party/swebench_shim"
echo "bootstrap.sh: ready ($venv)"
