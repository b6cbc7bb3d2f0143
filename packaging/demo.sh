#!/usr/bin/env bash
# Set up and start the camg demo on this Debian machine (root): the
# environments that exist so far, with their embedded demo data, on
# 127.0.0.1. Where systemd is PID 1 it installs the units and starts
# camg.target; elsewhere it runs the helper and the services in the
# foreground (Ctrl-C stops them and closes every episode).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -d /run/systemd/system ]; then
    "$here/install.sh" "$@"
    systemctl start camg.target
    systemctl --no-pager status 'camg-*' || true
else
    exec "$here/run-foreground.sh" "$@"
fi
