#!/bin/bash
# Run camg in the foreground where systemd is not PID 1 (containers, CI
# machines): what the units do, done by hand.
#
#   sudo packaging/run-foreground.sh [--skip-install] [--only ENV[,ENV...]] [install.sh args...]
#
# Installs first (packaging/install.sh, idempotent; --skip-install skips it),
# then starts the helper (root) on /run/camg/helper.sock and every configured
# service (/etc/camg/prepared/<env>.json) as user camg, with logs on this
# terminal. General and Visual also get a Docker engine (the one answering on
# /var/run/docker.sock, else a dockerd started here) and their judge's
# variables from /etc/camg/credentials/<env>-judge.env (what the units'
# EnvironmentFile= reads); when those files point at the demo's scripted
# judge, it is started here too (tools/judge_stub.py). AutoResearch gets its
# unit's ExecStartPre= (--check-clean) and the two capabilities its grader
# drop-in grants. Ctrl-C or SIGTERM stops the services (each closes its
# episodes), releases what they owned, stops the helper and sweeps: the same
# order as `systemctl stop camg.target`; then the judge and a dockerd
# started here.
set -euo pipefail

VENV=/srv/camg/service-venv
HELPER_VENV=/srv/camg/helper-venv
ETC=/etc/camg
STATE=/var/lib/camg
SOCKET=/run/camg/helper.sock
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CREDENTIALS=$ETC/credentials
DEMO_JUDGE_MARK="# camg demo: the scripted judge (tools/judge_stub.py), not a model"
CAMG_LOG_TAG=run-foreground
# shellcheck source=packaging/lib.sh
. "$HERE/lib.sh"
# shellcheck source=packaging/dockerd.sh
. "$HERE/dockerd.sh"
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
judge_pid=
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
    # The helper, then ExecStopPost= of the helper unit (the sweep: also the
    # containers of its scope).
    camg_stop_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json"
    if [ -n "$judge_pid" ]; then
        kill -TERM "$judge_pid" 2>/dev/null || true
        wait "$judge_pid" 2>/dev/null || true
    fi
    CAMG_CACHE=/var/cache/camg camg_dockerd_stop
    log "stopped"
}
trap 'stop_all; exit 0' INT TERM
trap stop_all EXIT

served() { [[ " ${envs[*]} " == *" $1 "* ]]; }

# The judge's variables of one service, exported into the current (sub)shell:
# KEY=VALUE lines as systemd's EnvironmentFile= reads them (never echoed).
load_judge_env() {
    local file=$CREDENTIALS/$1-judge.env line
    [ -f "$file" ] || return 0
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in ''|'#'*|';'*) continue ;; *=*) export "${line%%=*}=${line#*=}" ;; esac
    done < "$file"
}

# The demo's scripted judge: only where a served environment's credential
# file is the one install.sh wrote for the demo (an operator's is left alone).
start_demo_judge() {
    local env file port=
    for env in general visual; do
        served "$env" || continue
        file=$CREDENTIALS/$env-judge.env
        [ -f "$file" ] && [ "$(head -n 1 "$file")" = "$DEMO_JUDGE_MARK" ] || continue
        port=$(sed -n 's|^[A-Z_]*_URL=http://127\.0\.0\.1:\([0-9]*\)/v1$|\1|p' "$file" | head -n 1)
    done
    [ -n "$port" ] || return 0
    setpriv --reuid=camg --regid=camg --init-groups env -i PATH=/usr/bin:/bin HOME=/ \
        PYTHONUNBUFFERED=1 "$VENV/bin/python" -m tools.judge_stub --port "$port" &
    judge_pid=$!
    local i
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        kill -0 "$judge_pid" 2>/dev/null || die "the demo judge did not start"
        sleep 0.1
    done
    log "judge: the SCRIPTED demo judge on 127.0.0.1:$port (pid $judge_pid; not a model: write" \
        "$CREDENTIALS/{general,visual}-judge.env to use a real one)"
}

# A Docker engine for the served environments whose episodes run in task
# containers (their plugin's substrate: General, Visual).
containers=()
while read -r name substrate; do
    if [ "$substrate" = container ] && served "$name"; then containers+=("$name"); fi
done < <("$VENV/bin/python" -m camg.plugins --field substrate)
if [ ${#containers[@]} -gt 0 ]; then
    CAMG_CACHE=/var/cache/camg camg_dockerd_start || die "${containers[*]} need a Docker engine"
fi
start_demo_judge

# What READY=1 means under systemd: the isolation probes passed. Until then
# the helper refuses sandboxes, so services would fail their first episodes.
camg_start_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json" "$SOCKET" --probes

for env in "${envs[@]}"; do
    # StateDirectory=camg/<env>, User=camg.
    install -d -o camg -g camg -m 0750 "$STATE/$env"
    config=$ETC/prepared/$env.json
    # setpriv as the units run it: User=camg; AutoResearch's grader drop-in
    # grants CAP_SETUID/CAP_SETGID (the service drops them once its grader runs).
    run_as=(setpriv --reuid=camg --regid=camg --init-groups)
    if [ "$env" = autoresearch ]; then
        run_as+=(--inh-caps=+setuid,+setgid --ambient-caps=+setuid,+setgid
                 --bounding-set=-all,+setuid,+setgid)
        # ExecStartPre=: fresh state per invocation.
        (cd "$STATE/$env" && "${run_as[@]}" env -i PATH=/usr/bin:/bin HOME="$STATE/$env" \
            "$VENV/bin/python" -m camg.serve --config "$config" --check-clean) \
            || die "camg-$env: --check-clean failed"
    fi
    (
        cd "$STATE/$env"
        # The unit's environment only: nothing of this shell's, plus the
        # judge's variables (the units' EnvironmentFile=).
        for name in $(compgen -e); do unset "$name" 2>/dev/null || true; done
        export PATH=/usr/bin:/bin HOME="$STATE/$env" CAMG_ENV="$env" PYTHONUNBUFFERED=1
        load_judge_env "$env"
        exec "${run_as[@]}" "$VENV/bin/python" -m camg.serve --config "$config"
    ) &
    service_pids+=($!)
    log "camg-$env started (pid $!)"
done

log "all started; \`/srv/camg/service-venv/bin/camg status\` shows them (Ctrl-C stops everything)"

# Like Restart=no for a foreground run: the first service that exits ends
# the whole run, so a failure is never silently half-running.
wait -n "${service_pids[@]}" || true
log "a service exited"
