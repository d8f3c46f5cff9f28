#!/usr/bin/env bash
# Build the CPU stand-in for the official pytorch/pytorch image, without any registry:
# debootstrap a minimal Debian bookworm, add a Python 3.11 venv at /opt/venv holding the
# local CPU torch wheel, and `docker import` it as ONE layer (vfs copies every layer in
# full, so one layer keeps builds fast and the disk small).
#
#   docker/base-cpu.sh                  # builds $UPS_BASE_CPU_IMAGE unless it exists
#   docker/base-cpu.sh --force          # rebuild anyway
#
# Like the official image it has `python` with torch on PATH, so the project Dockerfile
# is the same for both bases. Needs root (debootstrap, chroot) and network to the Debian
# mirror and PyPI (torch's own dependencies); the torch wheel itself is local.
set -euo pipefail

TORCH_VERSION=${UPS_TORCH_VERSION:-2.13.0}
TORCH_WHEEL=${UPS_TORCH_WHEEL:-/opt/wheels/torch-${TORCH_VERSION}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}
IMAGE=${UPS_BASE_CPU_IMAGE:-ups-base-cpu:torch${TORCH_VERSION}-py3.11-bookworm}
SUITE=${UPS_DEBIAN_SUITE:-bookworm}
MIRROR=${UPS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The CA bundle pip uses on the host; it may hold a site CA that the Debian one lacks.
HOST_CA=${UPS_CA_BUNDLE:-$(python3 -m pip config get global.cert 2>/dev/null || echo /etc/ssl/certs/ca-certificates.crt)}

log() { echo "base-cpu: $*" >&2; }

if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists; nothing to do (--force rebuilds)"
    exit 0
fi
[ -f "$TORCH_WHEEL" ] || { log "torch wheel not found: $TORCH_WHEEL"; exit 1; }

ROOTFS=$(mktemp -d /var/tmp/ups-rootfs.XXXXXX)
cleanup() {
    umount "$ROOTFS/proc" 2>/dev/null || true
    rm -rf "$ROOTFS"
}
trap cleanup EXIT

start=$SECONDS
log "debootstrap $SUITE (minbase) into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libgomp1 \
    "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
cp "$HOST_CA" "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"

log "venv /opt/venv with $(basename "$TORCH_WHEEL")"
mount -t proc proc "$ROOTFS/proc"
cp "$TORCH_WHEEL" "$ROOTFS/tmp/"
# env -i: the host's PIP_* settings (local find-links, index files) do not exist in there.
in_root() { chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root /usr/bin/python3 -m venv /opt/venv
in_root /opt/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
    --upgrade pip "/tmp/$(basename "$TORCH_WHEEL")"
umount "$ROOTFS/proc"

# Keep the image small and free of host state.
rm -rf "$ROOTFS"/tmp/* "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/root/.cache
: >"$ROOTFS/etc/resolv.conf"

log "docker import as $IMAGE"
tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.opencontainers.image.title=ups-base-cpu" \
    --change "LABEL org.opencontainers.image.base.name=debian:$SUITE-minbase" \
    --change "LABEL io.ups.torch=$TORCH_VERSION+cpu" \
    --change 'CMD ["python"]' \
    - "$IMAGE" >/dev/null
log "built $IMAGE in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
