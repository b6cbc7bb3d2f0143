#!/bin/bash
# Run camg in the foreground where systemd is not PID 1 (containers, CI
# machines): what the units do, done by hand.
#
#   sudo packaging/run-foreground.sh [--skip-install] [--only ENV[,ENV...]] [install.sh args...]
#
# Installs first (packaging/install.sh, idempotent; --skip-install skips it),
# then starts the helper (root) on /run/camg/helper.sock and every configured
# service (/etc/camg/prepared/<env>.json) as user camg, with logs on this
# terminal. Ctrl-C or SIGTERM stops the services (each closes its episodes),
# releases what they owned, stops the helper and sweeps: the same order as
# `systemctl stop camg.target`.
set -euo pipefail

VENV=/srv/camg/service-venv
HELPER_VENV=/srv/camg/helper-venv
ETC=/etc/camg
STATE=/var/lib/camg
SOCKET=/run/camg/helper.sock
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CAMG_LOG_TAG=run-foreground
# shellcheck source=packaging/lib.sh
. "$HERE/lib.sh"
log() { camg_log "$@"; }
die() { camg_die "$@"; }

install=1 only= install_args=()
while [ $# -gt 0 ]; do
    case $1 in
        --skip-install) install=0 ;;
        --only) only=${2:?--only needs environment names}; shift ;;
        *) install_args+=("$1") ;;
    esac
    shift
done
[ "$(id -u)" -eq 0 ] || die "run as root (the helper builds sandboxes)"
if [ -d /run/systemd/system ]; then
    log "warning: systemd is PID 1 here; prefer systemctl start camg.target"
fi
[ "$install" -eq 1 ] && "$HERE/install.sh" "${install_args[@]}"

envs=()
for config in "$ETC"/prepared/*.json; do
    name=$(basename "$config" .json)
    case $name in routes|schedule) continue ;; esac
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then continue; fi
    envs+=("$name")
done
[ ${#envs[@]} -gt 0 ] || die "no configured environment in $ETC/prepared (run install.sh)"

service_pids=()
stopping=0
stop_all() {
    [ "$stopping" -eq 1 ] && return
    stopping=1
    trap '' INT TERM
    local pid env
    log "stopping ${envs[*]}"
    # Services first: SIGTERM lets gunicorn drain (episodes closed, outcome
    # records fsync'd), like KillMode=mixed.
    for pid in "${service_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${service_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    # ExecStopPost= of each service unit (a client of the helper; run from
    # the helper's venv, which holds camg.helper_client).
    for env in "${envs[@]}"; do
        "$HELPER_VENV/bin/python" -m camg.helper_client release-all --socket "$SOCKET" \
            --owner "$env" >/dev/null || true
    done
    # The helper, then ExecStopPost= of the helper unit (the sweep).
    camg_stop_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json"
    log "stopped"
}
trap 'stop_all; exit 0' INT TERM
trap stop_all EXIT

# What READY=1 means under systemd: the isolation probes passed. Until then
# the helper refuses sandboxes, so services would fail their first episodes.
camg_start_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json" "$SOCKET" --probes

for env in "${envs[@]}"; do
    # StateDirectory=camg/<env>, User=camg.
    install -d -o camg -g camg -m 0750 "$STATE/$env"
    (cd "$STATE/$env" && exec setpriv --reuid=camg --regid=camg --init-groups \
        env -i PATH=/usr/bin:/bin HOME="$STATE/$env" CAMG_ENV="$env" PYTHONUNBUFFERED=1 \
        "$VENV/bin/python" -m camg.serve --config "$ETC/prepared/$env.json") &
    service_pids+=($!)
    log "camg-$env started (pid $!)"
done

log "all started; \`/srv/camg/service-venv/bin/camg status\` shows them (Ctrl-C stops everything)"

# Like Restart=no for a foreground run: the first service that exits ends
# the whole run, so a failure is never silently half-running.
wait -n "${service_pids[@]}" || true
log "a service exited"
