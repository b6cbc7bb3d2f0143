#!/usr/bin/env bash
# For CI machines whose only Python 3.12 is a pyenv build under /root (0700:
# user camg cannot run it): copy it to /opt/camg-python3.12 (readable by
# all), with its RUNPATH made relative so the copy loads its own
# libpython, and print the copy's interpreter. Fails when there is none.
set -euo pipefail
dest=${CAMG_PYTHON312_COPY:-/opt/camg-python3.12}
if [ ! -x "$dest/bin/python3.12" ]; then
    src=$(ls -d /root/.pyenv/versions/3.12.* 2>/dev/null | sort -V | tail -1)
    [ -n "$src" ] && [ -x "$src/bin/python3.12" ] || exit 1
    command -v patchelf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q patchelf >&2
    rm -rf "$dest.tmp"
    cp -a "$src" "$dest.tmp"
    patchelf --set-rpath '$ORIGIN/../lib' "$dest.tmp/bin/python3.12"
    chmod -R a+rX "$dest.tmp"
    mv "$dest.tmp" "$dest"
fi
echo "$dest/bin/python3.12"
