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
    # The target is ordered after the services it wants, so this returns once
    # every one of them said READY=1 (or failed).
    systemctl start camg.target
    # The verdict: one row per environment, the helper, leftovers.
    exec /srv/camg/service-venv/bin/camg status
else
    exec "$here/run-foreground.sh" "$@"
fi
