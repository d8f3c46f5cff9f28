#!/usr/bin/env bash
# Build the ups images with the legacy builder (no BuildKit/buildx here) and host networking.
#
#   scripts/build-images.sh              # CPU base (if missing) + ups:cpu
#   scripts/build-images.sh --gpu        # ups:gpu FROM the pinned pytorch/pytorch image
#                                        # (needs a registry that has it)
#   scripts/build-images.sh --gpu --push ghcr.io/you/ups:0.1.0   # build, tag, push
#   scripts/build-images.sh --push 127.0.0.1:5000/ups:cpu        # the CPU image, pushed
#   scripts/build-images.sh --push REGISTRY/ups:TAG --no-build   # push the image built before
#   scripts/build-images.sh --gpu --build-args                   # print the build args only
#   UPS_IMAGE_CPU=ups:test scripts/build-images.sh
#
# --push needs `docker login REGISTRY` first (GHCR: a token with write:packages).
# .github/workflows/publish-image.yml builds the GPU image with --build-args' output.
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
print(f"CPU_PYTHON_VERSION={img['cpu']['python']}")
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
)

build() {  # build TAG BASE CUDA PYTHON TORCH_BUILD
    local start=$SECONDS out
    log "building $1 FROM $2"
    # Not --quiet: when docker/check_base.py stops the build, its lines are the message.
    if ! out=$(DOCKER_BUILDKIT=0 docker build --force-rm "${common_args[@]}" --build-arg "BASE_IMAGE=$2" \
            --build-arg "CUDA_VERSION=$3" --build-arg "PYTHON_VERSION=$4" \
            --build-arg "TORCH_BUILD=$5" -t "$1" . 2>&1); then
        printf '%s\n' "$out" | sed 's/\x1b\[[0-9;]*m//g' \
            | grep -v '^ ---> \|^Removing intermediate\|^Sending build\|^DEPRECATED\|^  *BuildKit\|^  *environment-var\|^$' \
            | tail -n 25 >&2
        log "building $1 failed (the lines above say why)"
        exit 1
    fi
    printf '%s\n' "$out" | grep -o 'check_base: .*' | sed 's/\x1b\[[0-9;]*m//g' >&2 || true
    log "built $1 in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$1") bytes)"
}

gpu=0 push="" args_only=0 no_build=0
while [ $# -gt 0 ]; do
    case "$1" in
        --gpu) gpu=1 ;;
        --push)
            [ $# -ge 2 ] || { log "--push needs an image reference: --push REGISTRY/ups:TAG"; exit 2; }
            push=$2; shift ;;
        --no-build) no_build=1 ;;
        --build-args) args_only=1 ;;
        *) log "unknown option $1 (use --gpu, --push REGISTRY/ups:TAG, --no-build, --build-args)"; exit 2 ;;
    esac
    shift
done
if [ "$no_build" = 1 ] && [ -z "$push" ]; then
    log "--no-build only goes with --push REGISTRY/ups:TAG (it pushes the image built before)"
    exit 2
fi

if [ "$args_only" = 1 ]; then  # KEY=VALUE lines, as docker/build-push-action's build-args
    printf '%s\n' "${common_args[@]}" | grep -E '^[A-Z_]+=' || true
    if [ "$gpu" = 1 ]; then
        printf 'BASE_IMAGE=%s\nCUDA_VERSION=%s\nPYTHON_VERSION=%s\nTORCH_BUILD=cuda\n' \
            "$GPU_BASE" "$CUDA_VERSION" "$PYTHON_VERSION"
    else
        printf 'BASE_IMAGE=%s\nCUDA_VERSION=none\nPYTHON_VERSION=%s\nTORCH_BUILD=cpu\n' \
            "$BASE_CPU" "$CPU_PYTHON_VERSION"
    fi
    exit 0
fi

if [ "$gpu" = 1 ]; then
    image=$IMAGE_GPU
else
    image=$IMAGE_CPU
fi
if [ "$no_build" = 1 ]; then
    if ! docker image inspect "$image" >/dev/null 2>&1; then
        log "--no-build: there is no image $image to push; build it first (without --no-build)"
        exit 1
    fi
elif [ "$gpu" = 1 ]; then
    build "$IMAGE_GPU" "$GPU_BASE" "$CUDA_VERSION" "$PYTHON_VERSION" cuda
else
    "$ROOT/docker/base-cpu.sh"
    build "$IMAGE_CPU" "$BASE_CPU" none "$CPU_PYTHON_VERSION" cpu
fi

if [ -n "$push" ]; then
    start=$SECONDS
    docker tag "$image" "$push"
    log "pushing $push"
    docker push --quiet "$push" >&2
    digest=$(docker image inspect -f '{{join .RepoDigests "\n"}}' "$push" | grep -F "${push%:*}@" | head -1)
    log "pushed $push in $((SECONDS - start))s: $digest"
    echo "$digest"
fi
