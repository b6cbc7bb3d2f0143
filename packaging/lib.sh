# Shell steps every packaging script shares. Sourced, never run:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# camg_python            the one interpreter every camg venv is made from
# camg_install_apt DIR   the Debian packages of DIR/packaging/apt/*.txt
# camg_venv VENV PY      a venv from PY (recreated when made by another one)
# camg_pip VENV ARGS     pip of VENV, with start-up noise filtered out
# camg_install_lock VENV LOCK   the lock, --no-deps (then camg_pip_check)
# camg_pip_check VENV    pip check, but pyserini's dense stack may be absent
# camg_pypi_pip VENV ARGS   pip of VENV with PyPI its only source (packaging/lock.sh)
# camg_python312         a Python 3.12 an unprivileged user can run, if any
# camg_helper_venv VENV PY CHECKOUT   the root helper's own small venv
# camg_start_helper BIN CONFIG SOCKET [--probes]   start a helper, wait for it
# camg_stop_helper BIN CONFIG                     stop it and sweep
# camg_environments PY   the registered environments (python -m camg.plugins)

# [elapsed seconds] in every line: where a long run spends its time.
camg_log() { printf '%s: [%4ss] %s\n' "${CAMG_LOG_TAG:-camg}" "$SECONDS" "$*" >&2; }
camg_die() { camg_log "error: $*"; exit 1; }

# The services run as user camg, so the interpreter must be one camg can
# execute (a pyenv build under /root is not). The seed asks for Python 3.12:
# take it where the machine has one, else Debian's own python3 (bookworm:
# 3.11.2), the baseline every test runs on. $CAMG_PYTHON overrides.
# Run it for real (its shared library and extension modules load): some
# kernels let exec through a directory whose files open() may not read.
_camg_check='import json, ssl, sys, venv'
_camg_runs_unprivileged() {
    local py=$1
    if [ "$(id -u)" -ne 0 ]; then
        "$py" -c "$_camg_check" 2>/dev/null
        return
    fi
    # nobody: any uid without /root access sees what camg would see.
    setpriv --reuid=65534 --regid=65534 --clear-groups -- "$py" -c "$_camg_check" 2>/dev/null
}

_camg_version_ok() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11, 2) else 1)' 2>/dev/null
}

camg_python() {
    if [ -n "${CAMG_PYTHON:-}" ]; then
        echo "$CAMG_PYTHON"
        return
    fi
    local candidate real
    for candidate in python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3; do
        candidate=$(command -v "$candidate" 2>/dev/null) || continue
        # Both the name found and what it runs (a shim is a script).
        _camg_runs_unprivileged "$candidate" || continue
        # A pyenv shim is a script: ask the interpreter where it really is.
        real=$("$candidate" -c 'import sys; print(sys.executable)' 2>/dev/null) || continue
        [ -n "$real" ] || continue
        _camg_version_ok "$real" || continue
        if _camg_runs_unprivileged "$real"; then
            echo "$real"
            return
        fi
    done
    camg_die "no usable interpreter: install python3 (Debian) or set CAMG_PYTHON"
}

camg_apt_packages() {
    # Every fragment names what one area needs; comments and blanks dropped.
    sed -e 's/#.*//' -e 's/[[:space:]]//g' "$1"/packaging/apt/*.txt | grep -v '^$' | sort -u
}

# Daemons of packages camg installs only for their binary (the tests run
# their own, on a loopback port, by pid): neither the package's postinst
# nor a boot may start one. systemd: masked before the install; invoke-rc.d
# (sysvinit, or no init at all): a policy-rc.d that refuses them while apt
# runs, unless the machine already has one (a container's refuses all).
_camg_never_started=(prometheus)

_camg_apt_get_install() {
    local policy=/usr/sbin/policy-rc.d made="" unit rc=0
    if [ -d /run/systemd/system ]; then
        for unit in "${_camg_never_started[@]}"; do
            systemctl mask -q "$unit.service" || true
        done
    fi
    if [ ! -e "$policy" ]; then
        local IFS='|'
        printf '#!/bin/sh\n# camg_install_apt (packaging/lib.sh), while apt runs\ncase "$1" in %s) exit 101 ;; esac\nexit 0\n' \
            "${_camg_never_started[*]}" > "$policy"
        chmod 0755 "$policy"
        made=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" || rc=$?
    [ -z "$made" ] || rm -f "$policy"
    return "$rc"
}

camg_install_apt() {
    local missing=() pkg
    for pkg in $(camg_apt_packages "$1"); do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    camg_log "apt: installing ${missing[*]}"
    apt-get update -q
    _camg_apt_get_install "${missing[@]}"
}

# pip's own noise (a configured local index folder that does not exist,
# legacy setup.py installs of sdists on Debian's pip, setuptools'
# beta/deprecation warnings of the builds) hides real errors;
# drop only those lines.
_camg_pip_noise='is ignored: it is neither a file nor a directory|legacy .setup\.py install. method|SetuptoolsDeprecationWarning|_BetaConfiguration|^ *warnings\.warn\('

camg_pip() {
    local venv=$1
    shift
    "$venv/bin/python" -m pip --disable-pip-version-check "$@" \
        2> >(grep -Ev "$_camg_pip_noise" >&2)
}

# The lock is the whole dependency set (packaging/lock.sh): --no-deps, so a
# missing pin fails `pip check` instead of pulling an unpinned version, and
# pyserini comes without its dense-retrieval requirements (requirements/nodeps.in).
camg_install_lock() {
    camg_pip "$1" install -q --no-deps -r "$2"
}

# pyserini declares its dense-retrieval stack (transformers, onnxruntime,
# nmslib, ...) as requirements; Shop's BM25 search imports none of it.
camg_pip_check() {
    local out
    out=$("$1/bin/python" -m pip --disable-pip-version-check check 2>&1 \
        | grep -Ev '^pyserini [^ ]+ requires [^ ]+, which is not installed\.$|^No broken requirements found\.$') || true
    [ -z "$out" ] || camg_die "the venv $1 has inconsistent dependencies: $out"
}

# This machine's pip configuration (find-links, extra indexes, constraints)
# switched off: what a user's machine that reaches only PyPI resolves.
camg_pypi_pip() {
    local venv=$1
    shift
    PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip --isolated --disable-pip-version-check \
        "$@" --index-url https://pypi.org/simple 2> >(grep -Ev "$_camg_pip_noise" >&2)
}

camg_python312() {
    local candidate
    for candidate in ${CAMG_PYTHON312:-} python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12 \
                     /opt/camg-python3.12/bin/python3.12; do
        candidate=$(command -v "$candidate" 2>/dev/null) || continue
        candidate=$("$candidate" -c 'import sys; print(sys.executable)' 2>/dev/null) || continue
        [ -n "$candidate" ] && _camg_runs_unprivileged "$candidate" || continue
        "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || continue
        echo "$candidate"
        return 0
    done
    return 1
}

camg_venv() {
    local venv=$1 python=$2 base='import sys; print(sys.base_prefix, sys.version)'
    if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c "$base" 2>/dev/null)" != "$("$python" -c "$base")" ]; then
        camg_log "$venv was made by another interpreter; recreating it with $python"
        rm -rf "$venv"
    fi
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
}

# The helper runs as root from a venv of its own: only what helper/ imports
# at run time (requirements/helper.in, pinned by the lock) and the project
# itself, --no-deps (the helper imports helper/, camg.helper_wire and
# camg.typed; see helper/README.md "What runs as root").
camg_helper_venv() {
    local venv=$1 python=$2 checkout=$3
    camg_venv "$venv" "$python"
    local stamp="$venv/.camg-helper.sha256" want
    want=$(cat "$checkout/requirements/helper.in" "$checkout/requirements.lock" | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        camg_pip "$venv" install -q -r "$checkout/requirements/helper.in" -c "$checkout/requirements.lock"
        echo "$want" > "$stamp"
    fi
    camg_pip "$venv" install -q --no-deps -e "$checkout"
}

# The helper's probes verdict over its socket (what READY=1 means under systemd).
camg_helper_probes_ok() {
    "$1" -c 'import sys
from camg.helper_client import HelperClient
sys.exit(0 if HelperClient(sys.argv[1]).ping().get("probes_ok") else 1)' "$2" 2>/dev/null
}

# Start a helper in the background (CAMG_HELPER_PID), wait until it listens;
# with --probes also until its isolation probes passed.
CAMG_HELPER_PID=
camg_start_helper() {
    local bin=$1 config=$2 socket=$3 wait_probes=${4:-} i
    "$bin" --config "$config" --socket "$socket" &
    CAMG_HELPER_PID=$!
    for i in $(seq 1 150); do
        [ -S "$socket" ] && break
        kill -0 "$CAMG_HELPER_PID" 2>/dev/null || camg_die "camg-helper exited; see its log above"
        sleep 0.1
    done
    [ -S "$socket" ] || camg_die "camg-helper did not listen on $socket"
    [ "$wait_probes" = --probes ] || return 0
    local python
    python="$(dirname "$bin")/python"
    for i in $(seq 1 240); do
        camg_helper_probes_ok "$python" "$socket" && return 0
        kill -0 "$CAMG_HELPER_PID" 2>/dev/null || camg_die "camg-helper exited; see its log above"
        sleep 0.5
    done
    camg_die "camg-helper's isolation probes did not pass; see its log above"
}

# Stop the helper started above, then sweep what it may have left (the
# helper unit's ExecStopPost=).
camg_stop_helper() {
    local bin=$1 config=$2
    [ -n "$CAMG_HELPER_PID" ] || return 0
    kill -TERM "$CAMG_HELPER_PID" 2>/dev/null || true
    wait "$CAMG_HELPER_PID" 2>/dev/null || true
    CAMG_HELPER_PID=
    "$bin" --config "$config" --sweep || true
}

# The environments registered as camg.environments entry points, one a line.
camg_environments() {
    "$1" -m camg.plugins --names
}
