# Sourced by containers/sam-local: a Docker daemon to talk to, and the host tools the stand-in
# images are built with.
#
# ensure_docker: uses the daemon that answers; otherwise, as root, installs Debian's docker.io
# (apt) if dockerd is missing and starts dockerd in the background (DOCKERD_PID is then set,
# and stop_docker stops it). Anything else: one line on stderr saying what is missing, status 1.

DOCKERD_PID=""

need_root_for() {
    if [[ "$(id -u)" != 0 ]]; then
        echo "sam-local: $1, and installing or starting it needs root" >&2
        return 1
    fi
}

apt_install() {
    command -v apt-get >/dev/null || { echo "sam-local: $1 is missing and there is no apt-get to install it" >&2; return 1; }
    echo "installing $* with apt-get"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } \
        >"${TMPDIR:-/tmp}/wsfleet-apt.log" 2>&1 \
        || { echo "sam-local: apt-get install $* failed (${TMPDIR:-/tmp}/wsfleet-apt.log)" >&2; return 1; }
}

ensure_docker() {
    if ! command -v docker >/dev/null; then
        need_root_for "the docker client is missing" || return 1
        apt_install docker.io || return 1
    fi
    if docker info >/dev/null 2>&1; then
        echo "using the running Docker daemon ($(docker version --format '{{.Server.Version}}'))"
        return 0
    fi
    if ! command -v dockerd >/dev/null; then
        need_root_for "no Docker daemon answers and dockerd is missing" || return 1
        apt_install docker.io || return 1
    fi
    need_root_for "no Docker daemon answers (docker info)" || return 1
    local log="${TMPDIR:-/tmp}/wsfleet-dockerd.log"
    echo "starting dockerd (log: $log)"
    dockerd >"$log" 2>&1 &
    DOCKERD_PID=$!
    local waited=0
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
            echo "sam-local: dockerd exited at start: $(tail -1 "$log")" >&2
            DOCKERD_PID=""
            return 1
        fi
        if ((waited++ >= 60)); then
            echo "sam-local: dockerd did not answer within 30 s ($log)" >&2
            return 1
        fi
        sleep 0.5
    done
}

stop_docker() {
    [[ -n "$DOCKERD_PID" ]] || return 0
    kill -TERM "$DOCKERD_PID" 2>/dev/null || return 0
    wait "$DOCKERD_PID" 2>/dev/null || true
    DOCKERD_PID=""
}

ensure_debootstrap() {
    command -v debootstrap >/dev/null && return 0
    need_root_for "debootstrap is missing (the stand-in images are built with it)" || return 1
    apt_install debootstrap
}
