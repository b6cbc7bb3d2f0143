# Sourced by packaging/run-tests.sh: a Docker engine for the container tests
# (tests/privileged/test_containers*.py). If one already answers on
# /var/run/docker.sock it is used and left alone; otherwise dockerd (Debian's
# docker.io, from packaging/apt/helper.txt) is started here and stopped by
# its pid when the tests end. dockerd runs its own containerd.

CAMG_DOCKERD_PID=

camg_docker_answers() {
    timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

camg_dockerd_start() {
    camg_docker_answers && return 0
    if ! command -v dockerd >/dev/null; then
        echo "dockerd.sh: dockerd is not installed (packaging/apt/helper.txt lists docker.io)" >&2
        return 1
    fi
    local log="${CAMG_CACHE:-/var/cache/camg-test}/dockerd.log"
    mkdir -p "$(dirname "$log")"
    dockerd --host unix:///var/run/docker.sock >>"$log" 2>&1 &
    CAMG_DOCKERD_PID=$!
    local i
    for i in $(seq 1 150); do
        camg_docker_answers && { echo "dockerd.sh: started dockerd (pid $CAMG_DOCKERD_PID)" >&2; return 0; }
        kill -0 "$CAMG_DOCKERD_PID" 2>/dev/null || break
        sleep 0.2
    done
    echo "dockerd.sh: dockerd did not answer; its log ($log):" >&2
    tail -n 30 "$log" >&2 || true
    camg_dockerd_stop
    return 1
}

camg_dockerd_stop() {
    [ -n "$CAMG_DOCKERD_PID" ] || return 0
    kill -TERM "$CAMG_DOCKERD_PID" 2>/dev/null || true
    # dockerd stops its containerd and containers itself (up to its shutdown timeout).
    local i
    for i in $(seq 1 150); do
        kill -0 "$CAMG_DOCKERD_PID" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$CAMG_DOCKERD_PID" 2>/dev/null || true
    wait "$CAMG_DOCKERD_PID" 2>/dev/null || true
    CAMG_DOCKERD_PID=
}
