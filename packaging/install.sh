#!/bin/bash
# Install (or, with --uninstall, remove) camg on a Debian host.
#
#   sudo packaging/install.sh [--deployment FILE | --environments NAME,...]
#                             [--helper-config FILE] [--no-apt]
#                             [--no-configure] [--python PATH]
#   sudo packaging/install.sh --uninstall [--purge]
#
# Run from a git checkout of camg. Safe to run again: every step checks what
# is already there. Afterwards, on a host where systemd is PID 1, only
# `systemctl start camg-coding` (or camg.target) remains; elsewhere
# packaging/run-foreground.sh runs the same installation in the foreground.
#
# Layout (see docs/operators.md, "Layout", and packaging/README.md):
#   /srv/camg/src            clean git clone of the installed commit
#   /srv/camg/service-venv   the services' virtualenv (requirements.lock)
#   /srv/camg/helper-venv    the root helper's own small virtualenv
#                            (requirements/helper.in; helper/README.md)
#   /srv/camg/data           prepared demo data (tasks, mirrors, manifests)
#   /var/lib/camg/oci-rootfs materialized images (helper lower root)
#   /var/cache/camg          build caches of the demo data ($CAMG_DEMO_CACHE;
#                            its oci/ and helper/ are helper lower roots)
#   /etc/camg                helper.json, deployment.json, prepared/<env>.json
#   /var/lib/camg/<env>      state: outcome records, trajectories (kept by
#                            --uninstall unless --purge)
#   /usr/local/lib/systemd/system, /usr/local/lib/{sysusers,tmpfiles}.d
set -euo pipefail

PREFIX=/srv/camg
SRC=$PREFIX/src
VENV=$PREFIX/service-venv
DATA=$PREFIX/data
ETC=/etc/camg
STATE=/var/lib/camg
UNITDIR=/usr/local/lib/systemd/system
SYSUSERS=/usr/local/lib/sysusers.d/camg.conf
TMPFILES=/usr/local/lib/tmpfiles.d/camg.conf
HELPER_VENV=$PREFIX/helper-venv
# The demo build cache (images, the renderer tree, task sets), keyed by
# inputs; --uninstall keeps it.
DEMO_CACHE=${CAMG_DEMO_CACHE:-/var/cache/camg}
CREDENTIALS=/etc/camg/credentials
# The scripted judge of the demo (tools/judge_stub.py) and the first line of
# the credential files that point at it.
DEMO_JUDGE_PORT=${CAMG_DEMO_JUDGE_PORT:-65149}
DEMO_JUDGE_MARK="# camg demo: the scripted judge (tools/judge_stub.py), not a model"
CAMG_DOCKERD_PID=
CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CAMG_LOG_TAG=install.sh
# shellcheck source=packaging/lib.sh
. "$CHECKOUT/packaging/lib.sh"
# shellcheck source=packaging/dockerd.sh
. "$CHECKOUT/packaging/dockerd.sh"
log() { camg_log "$@"; }
die() { camg_die "$@"; }
# Filled from the installed venv's registry (python -m camg.plugins --names),
# with each one's systemd unit (its plugin's ``unit``).
ENVIRONMENTS=()
declare -A UNITS=()
# sd_booted(): the same test libsystemd uses.
systemd_running() { [ -d /run/systemd/system ]; }

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

action=install purge=0 apt=1 configure=1
# The interpreter every venv is made from: packaging/lib.sh camg_python
# (3.12 where user camg can run one, else Debian's python3), unless --python.
python=
# Without --deployment the demo deployment is used: prepare_demo.py writes
# it (packaging/demo-deployment.json narrowed to --environments, with the
# settings the preparation recorded, e.g. Shop's index hash).
deployment=
demo_environments=all
helper_config=$CHECKOUT/units/helper.json
while [ $# -gt 0 ]; do
    case $1 in
        --uninstall) action=uninstall ;;
        --purge) purge=1 ;;
        --no-apt) apt=0 ;;
        # The interpreter the venvs are made from: it must satisfy every
        # Requires-Python in requirements.lock, and user camg must be able to
        # execute it.
        --python) python=${2:?--python needs an interpreter}; shift ;;
        # Software, users and units only: for an operator who prepares data
        # and runs camg.configure with a deployment of their own.
        --no-configure) configure=0 ;;
        --deployment) deployment=$(realpath "${2:?--deployment needs a file}"); shift ;;
        --environments) demo_environments=${2:?--environments needs names}; shift ;;
        --helper-config) helper_config=$(realpath "${2:?--helper-config needs a file}"); shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage 2 ;;
    esac
    shift
done
[ "$(id -u)" -eq 0 ] || die "run as root (it creates users, units and /srv/camg)"

install_source() {
    # A clone, not a copy: camg.configure records the commit and refuses a
    # dirty tree, and a clone of HEAD is clean by construction.
    git -C "$CHECKOUT" rev-parse --verify -q HEAD >/dev/null || die "$CHECKOUT is not a git checkout"
    if [ -n "$(git -C "$CHECKOUT" status --porcelain --untracked-files=no)" ]; then
        log "warning: $CHECKOUT has uncommitted changes; installing its last commit only"
    fi
    mkdir -p "$PREFIX"
    if [ ! -d "$SRC/.git" ]; then
        git clone --quiet --no-hardlinks "$CHECKOUT" "$SRC"
    fi
    git -C "$SRC" fetch --quiet "$CHECKOUT" HEAD
    git -C "$SRC" checkout --quiet --force --detach FETCH_HEAD
    git -C "$SRC" clean --quiet -fdx
    log "source: $SRC at $(git -C "$SRC" rev-parse --short HEAD)"
}

install_venv() {
    log "service venv: $VENV from $python ($("$python" -V 2>&1))"
    camg_venv "$VENV" "$python"
    # --no-deps (lib.sh camg_install_lock): the lock is the whole dependency
    # set; a missing pin must fail `pip check` below rather than pull an
    # unpinned version.
    camg_install_lock "$VENV" "$SRC/requirements.lock"
    # Editable: the services run the very tree camg.configure records (a
    # clean clone at one commit).
    camg_pip "$VENV" install -q --no-deps -e "$SRC"
    # Vendored packages the project imports (e.g. third_party/swebench_shim).
    local vendored
    for vendored in "$SRC"/third_party/*/pyproject.toml; do
        [ -e "$vendored" ] || continue
        camg_pip "$VENV" install -q --no-deps --force-reinstall "$(dirname "$vendored")"
    done
    camg_pip_check "$VENV"
    # The helper's own venv: what runs as root is helper/ and its few pins,
    # not the services' ~200 packages (helper/README.md).
    log "helper venv: $HELPER_VENV"
    camg_helper_venv "$HELPER_VENV" "$python" "$SRC"
    # pip builds in the tree (build/, *.egg-info); camg.configure refuses a
    # tree with untracked files, so leave the clone exactly at its commit.
    git -C "$SRC" clean --quiet -fdx
    mapfile -t ENVIRONMENTS < <(camg_environments "$VENV/bin/python")
    [ ${#ENVIRONMENTS[@]} -gt 0 ] || die "no environment is registered (camg.environments entry points)"
    log "registered environments: ${ENVIRONMENTS[*]}"
    local env unit
    while read -r env unit; do
        UNITS[$env]=$unit
    done < <("$VENV/bin/python" -m camg.plugins --field unit)
}

install_system_files() {
    install -D -m 0644 "$SRC/units/sysusers.d/camg.conf" "$SYSUSERS"
    install -D -m 0644 "$SRC/units/tmpfiles.d/camg.conf" "$TMPFILES"
    # Its "Creating group/user …" lines are info-level: quiet preparation
    # keeps warnings and errors only.
    SYSTEMD_LOG_LEVEL=warning systemd-sysusers "$SYSUSERS"
    # sysusers reports some failures only on stderr; check the result.
    getent passwd camg >/dev/null && getent passwd camg-agent >/dev/null \
        || die "systemd-sysusers did not create camg and camg-agent"
    systemd-tmpfiles --create "$TMPFILES"
    install -d -m 0755 "$UNITDIR"
    local unit env
    for unit in camg-helper.socket camg-helper.service camg.target; do
        install -m 0644 "$SRC/units/$unit" "$UNITDIR/$unit"
    done
    # Each environment's unit and drop-ins are made from its plugin, with the
    # shared drop-in units/camg-environment.conf (camg.unit_files).
    "$VENV/bin/python" -m camg.unit_files --unitdir "$UNITDIR" \
        --shared "$SRC/units/camg-environment.conf" "${ENVIRONMENTS[@]}" \
        || die "could not write the environments' units"
    install -d -m 0755 "$ETC"
    install -m 0644 "$helper_config" "$ETC/helper.json"
}

# A helper for preparation: systemd's socket where systemd runs (the real
# unit, socket-activated), else a foreground helper for the duration.
start_prep_helper() {
    if systemd_running; then
        systemctl daemon-reload
        systemctl start camg-helper.socket
        PREP_SOCKET=/run/camg/helper.sock
        return
    fi
    PREP_SOCKET=/run/camg/install-helper.sock
    camg_start_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json" "$PREP_SOCKET"
}

stop_prep_helper() {
    camg_stop_helper "$HELPER_VENV/bin/camg-helper" "$ETC/helper.json"
}

prepare_demo() {
    # The demo data of the demo deployment, made with the environments' own
    # preparation code (packaging/prepare_demo.py). Runs as root: the helper's
    # lower roots are root-owned and closed to everyone but group camg.
    local prep=("$VENV/bin/python" "$SRC/packaging/prepare_demo.py" --data "$DATA"
                --cache "$DEMO_CACHE" --environments "$demo_environments"
                --helper-config-in "$helper_config")
    local names
    names=$("${prep[@]}" --helper-socket "" --list)
    # Rows, mirrors, references, gold patches, the AutoResearch bundles'
    # answers: root's and the services' only (the helper reads lowers as root).
    install -d -m 0750 -o root -g camg "$DATA" "$DEMO_CACHE"
    # What preparation's own sandboxes need: the cache's lower roots.
    "${prep[@]}" --helper-socket "" --helper-config-only --helper-config-out "$ETC/helper.json"
    if needs_docker "$names"; then
        start_docker
    fi
    start_prep_helper
    trap 'stop_prep_helper; camg_dockerd_stop' EXIT
    "${prep[@]}" --helper-socket "$PREP_SOCKET" \
        --deployment-template "$SRC/packaging/demo-deployment.json" \
        --deployment-out "$DATA/deployment.json" --helper-config-out "$DATA/helper.json"
    stop_prep_helper
    trap - EXIT
    camg_dockerd_stop
    # The served helper configuration: plus the container mediator (allowed
    # images by digest, the agent environment) when General or Visual is served.
    install -m 0644 "$DATA/helper.json" "$ETC/helper.json"
    if systemd_running; then
        # Socket-activated again on the next connection, with this configuration.
        # --quiet: not the "can still be activated by camg-helper.socket"
        # warning; that activation is the point.
        systemctl --quiet stop camg-helper.service
    fi
    if grep -qxE 'general|visual' <<<"$names"; then
        write_demo_judge "$(grep -xE 'general|visual' <<<"$names")"
    fi
}

# General and Visual take the judge's URL, model and key from the service's
# environment only (units: EnvironmentFile=/etc/camg/credentials/<env>-judge.env,
# written by the operator). For the demo, unless the operator wrote one, the
# files point at the scripted judge on loopback (tools/judge_stub.py, which
# demo.sh / run-foreground.sh start). A file the operator wrote is never touched.
write_demo_judge() {
    local env prefix file key
    install -d -m 0700 "$CREDENTIALS"
    for env in $1; do
        case $env in general) prefix=GA_JUDGE ;; visual) prefix=WD_JUDGE ;; esac
        file=$CREDENTIALS/$env-judge.env
        if [ -f "$file" ] && ! grep -q "^$DEMO_JUDGE_MARK" "$file"; then
            log "$env: judge from $file (the operator's)"
            continue
        fi
        key=demo-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
        (umask 077; printf '%s\n%s\n%s_URL=http://127.0.0.1:%s/v1\n%s_MODEL=scripted-demo-judge\n%s_KEY=%s\n' \
            "$DEMO_JUDGE_MARK" "# Replace this file with your judge's ${prefix}_URL, ${prefix}_MODEL, ${prefix}_KEY." \
            "$prefix" "$DEMO_JUDGE_PORT" "$prefix" "$prefix" "$key" > "$file.new")
        mv "$file.new" "$file"
        log "$env: judge = the SCRIPTED demo judge on 127.0.0.1:$DEMO_JUDGE_PORT (not a model; write $file to use a real one)"
    done
}

# Whether any of NAMES (one a line) runs task containers (its plugin's
# substrate: General, Visual).
needs_docker() {
    local env substrate
    while read -r env substrate; do
        if [ "$substrate" = container ] && grep -qx "$env" <<<"$1"; then return 0; fi
    done < <("$VENV/bin/python" -m camg.plugins --field substrate)
    return 1
}

# General and Visual run task containers: a Docker engine must answer on
# /var/run/docker.sock (docker.io, packaging/apt/helper.txt).
start_docker() {
    if systemd_running; then
        systemctl start docker.service
        return
    fi
    CAMG_CACHE=$DEMO_CACHE camg_dockerd_start || die "no Docker engine (General and Visual need one)"
}

configure_services() {
    install -m 0644 "$deployment" "$ETC/deployment.json"
    # From the clean clone (the editable install's tree), whose HEAD
    # configure records. It makes the outcome signing key if missing
    # (<state_root>/signing/outcomes.key, 0600), owned by the services' user.
    (cd "$SRC" && "$VENV/bin/python" -m camg.configure --key-owner camg \
        --deployment "$ETC/deployment.json" --output "$ETC/prepared.new")
    rm -rf "$ETC/prepared.old"
    [ -d "$ETC/prepared" ] && mv "$ETC/prepared" "$ETC/prepared.old"
    mv "$ETC/prepared.new" "$ETC/prepared"
    rm -rf "$ETC/prepared.old"
    chmod -R a+rX "$ETC/prepared"
}

# The services answer only trainers with a token (camg/web/auth.py). The user
# who ran this gets one, with the operator role, where camg_client looks
# by default (~/.config/camg/token); each run replaces it. More trainers:
# camg trainer add NAME.
local_token() {
    local user=${SUDO_USER:-$(id -un)} home
    home=$(getent passwd "$user" | cut -d: -f6)
    [ -n "$home" ] || die "no home directory for $user (its trainer token goes there)"
    local said
    said=$("$VENV/bin/camg" trainer add "local-$user" --role operator --replace \
        --token-file "$home/.config/camg/token" --file "$ETC/trainers.json" 2>&1) \
        || die "camg trainer add failed: $said"
    log "$said"
    chown "$user:" "$home/.config/camg" "$home/.config/camg/token"
}

enable_units() {
    local env wanted=()
    for env in "${ENVIRONMENTS[@]}"; do
        [ -f "$ETC/prepared/$env.json" ] && wanted+=("${UNITS[$env]}")
    done
    # `systemctl enable` only writes symlinks, so it works without a running
    # systemd too; camg.target then starts exactly the configured services.
    if command -v systemctl >/dev/null; then
        systemctl enable --quiet camg-helper.socket "${wanted[@]}"
    fi
    if systemd_running; then
        systemctl daemon-reload
        systemctl start camg-helper.socket
    fi
    log "configured: ${wanted[*]:-none}"
}

# What is private in the sandbox must be private on the host: camg audit
# (camg/host_audit.py) lists every private path the configuration names and
# fails on one others can read or write.
AUDIT_PATHS=()
audit_private_paths() {
    "$VENV/bin/camg" audit --quiet --etc "$ETC" "${AUDIT_PATHS[@]}" \
        || die "private paths are open to others (above): close them, then run install.sh again"
}

uninstall() {
    # Whatever was installed, whether or not it is still registered.
    local units=(camg.target camg-helper.socket camg-helper.service) unit
    for unit in "$UNITDIR"/camg-*.service; do
        [ -f "$unit" ] || continue
        unit=$(basename "$unit")
        case $unit in camg-helper.service) ;; *) units+=("$unit") ;; esac
    done
    if systemd_running; then
        # The demo's scripted judge is a transient unit (demo.sh).
        systemctl stop "${units[@]}" camg-demo-judge.service 2>/dev/null || true
    fi
    if [ -f "$UNITDIR/camg.target" ]; then
        systemctl disable --quiet "${units[@]}" 2>/dev/null || true
    fi
    for unit in "${units[@]}"; do
        rm -rf "${UNITDIR:?}/$unit" "$UNITDIR/$unit.d"
    done
    rm -f "$SYSUSERS" "$TMPFILES"
    if [ "$purge" -eq 1 ] && [ -f "$DATA/container-images.json" ] && camg_docker_answers; then
        # The demo's task images in dockerd, exactly the references it pulled
        # (containers are the helper's to remove; other images are not ours).
        grep -o '"[^"]*@sha256:[0-9a-f]*"' "$DATA/container-images.json" | tr -d '"' \
            | xargs -r docker image rm >/dev/null 2>&1 || true
    fi
    rm -rf "$PREFIX" "$ETC" /run/camg /run/camg-helper
    if [ "$purge" -eq 1 ]; then
        # AutoResearch's private answers too.
        rm -rf "$STATE" /var/lib/camg-grader
        log "kept the demo build cache $DEMO_CACHE (rm -rf it to rebuild from nothing)"
    elif [ -d "$STATE" ]; then
        log "kept $STATE (outcome records, trajectories); --purge removes it"
    fi
    systemd_running && systemctl daemon-reload
    # The camg user and group stay: files in $STATE may still be owned by
    # them, and reusing a removed uid for someone else would hand those over.
    log "uninstalled"
}

if [ "$action" = uninstall ]; then
    uninstall
    exit 0
fi
[ -z "$deployment" ] || [ -f "$deployment" ] || die "deployment $deployment not found"
[ -f "$helper_config" ] || die "helper config $helper_config not found"
[ "$apt" -eq 1 ] && camg_install_apt "$CHECKOUT"
[ -n "$python" ] || python=$(camg_python)
install_source
install_venv
install_system_files
if [ "$configure" -eq 1 ]; then
    if [ -z "$deployment" ]; then
        prepare_demo
        deployment=$DATA/deployment.json
        AUDIT_PATHS+=(--path "$DATA" --path "$DEMO_CACHE")
    fi
    configure_services
    local_token
fi
enable_units
if [ "$configure" -eq 1 ]; then
    audit_private_paths
fi
if systemd_running; then
    log "done: systemctl start camg-coding   (or camg.target for every configured service)"
else
    log "done: systemd is not PID 1 here; run $CHECKOUT/packaging/run-foreground.sh"
fi
