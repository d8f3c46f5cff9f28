#!/usr/bin/env bash
# Build the ups images with the legacy builder (no BuildKit/buildx here) and host networking.
#
#   scripts/build-images.sh              # CPU base (if missing) + ups:cpu
#   scripts/build-images.sh --gpu        # ups:gpu FROM the pinned pytorch/pytorch image
#                                        # (needs a registry that has it)
#   UPS_IMAGE_CPU=ups:test scripts/build-images.sh
#
# Labels carry the pins from pins.toml and the git revision, so `docker inspect` on any
# host tells which versions and which commit an image holds.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
IMAGE_CPU=${UPS_IMAGE_CPU:-ups:cpu}
IMAGE_GPU=${UPS_IMAGE_GPU:-ups:gpu}
BASE_CPU=${UPS_BASE_CPU_IMAGE:-ups-base-cpu:torch2.13.0-py3.11-bookworm}
export UPS_BASE_CPU_IMAGE=$BASE_CPU

log() { echo "build-images: $*" >&2; }

# One line of KEY=VALUE per pin, read with the stdlib TOML parser.
pins=$(python3 - <<'EOF'
import tomllib
p = tomllib.load(open("pins.toml", "rb"))
v, img = p["versions"], p["image"]
ref = f'{img["base"]}:{img["tag"]}' + (f'@{img["digest"]}' if img.get("digest") else "")
for k in ("python", "torch", "cuda", "cudnn", "nccl"):
    print(f"{k.upper()}_VERSION={v[k]}")
print(f"GPU_BASE={ref}")
EOF
)
eval "$pins"

common_args=(
    --network host
    --build-arg "VERSION=$(python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')"
    --build-arg "GIT_REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . 2>/dev/null || echo -dirty)"
    --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    --build-arg "TORCH_VERSION=$TORCH_VERSION"
    --build-arg "CUDNN_VERSION=$CUDNN_VERSION"
    --build-arg "NCCL_VERSION=$NCCL_VERSION"
    --build-arg "PYTHON_VERSION=$PYTHON_VERSION"
)

build() {  # build TAG BASE CUDA
    local start=$SECONDS
    log "building $1 FROM $2"
    DOCKER_BUILDKIT=0 docker build --quiet "${common_args[@]}" \
        --build-arg "BASE_IMAGE=$2" --build-arg "CUDA_VERSION=$3" -t "$1" . >/dev/null
    log "built $1 in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$1") bytes)"
}

if [ "${1:-}" = "--gpu" ]; then
    build "$IMAGE_GPU" "$GPU_BASE" "$CUDA_VERSION"
else
    "$ROOT/docker/base-cpu.sh"
    build "$IMAGE_CPU" "$BASE_CPU" "none"
fi
