# The ups image: the pinned PyTorch runtime plus ups. ENTRYPOINT is `ups launch`
# (preflight, then torchrun). Build with scripts/build-images.sh, which fills in the
# labels from pins.toml and git; docs/docker.md explains the layers.
#
#   GPU (default base):  docker build -t ups:gpu .
#   CPU (local base):    docker build --build-arg BASE_IMAGE=ups-base-cpu:... -t ups:cpu .
#
# The base must provide `python` with torch on PATH: the official image does (/opt/conda,
# Python 3.12), and so does the CPU stand-in from docker/base-cpu.sh (/opt/venv, 3.11). The
# first RUN checks its versions against pins.toml and stops the build when they differ.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:db80a41f8428644cebcb3d75b0b62df334ab6c0e75785951eb25f48bfbd42407
FROM ${BASE_IMAGE}

ARG UPS_UID=1000
# cuda: the base must hold a CUDA build of torch with pins.toml's CUDA, cuDNN and NCCL;
# cpu: a CPU build (scripts/build-images.sh passes it for ups:cpu).
ARG TORCH_BUILD=cuda

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/ups \
    UPS_PINS=/app/pins.toml

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# A fixed uid, so host directories can be chowned to it (docs/docker.md). Ubuntu 24.04
# bases ship a user "ubuntu" with uid 1000: that one gives way. HOME is open to any uid,
# for `user: UID:GID` in compose (W&B and torch keep small caches there).
RUN if getent passwd "${UPS_UID}" >/dev/null; then \
        userdel --remove "$(getent passwd "${UPS_UID}" | cut -d: -f1)" 2>/dev/null || true; \
    fi \
    && useradd --create-home --uid "${UPS_UID}" --shell /bin/bash ups \
    && chmod 1777 /home/ups \
    && mkdir -p /app/runs /app/data /app/cache \
    && chown -R ups:ups /app

WORKDIR /app

# The base holds what pins.toml names (Python, torch, CUDA, cuDNN, NCCL), or the build
# stops here naming both versions of each difference (docker/check_base.py).
COPY pins.toml docker/check_base.py ./
RUN python check_base.py pins.toml "${TORCH_BUILD}" && rm check_base.py

# Dependencies layer: changes only when the lock changes. The lock (docker/lock.sh: uv,
# every Python the images use, with hashes) holds ups's dependencies except torch, which
# the base has; pip installs exactly those files, or fails.
COPY docker/requirements.lock ./
RUN python -m pip install --require-hashes -r requirements.lock

# Source layers: a one-line change in ups/ rebuilds only these small layers.
COPY configs/ configs/
COPY pyproject.toml ./
COPY ups/ ups/
COPY docker/entrypoint.sh /usr/local/bin/ups-entrypoint
RUN python -m pip install --no-deps --no-build-isolation . \
    && rm -rf build ./*.egg-info \
    && ups --version

# Metadata last: build args are part of every later RUN's cache key in the legacy
# builder, so a new git revision or date must not invalidate the dependency layer.
ARG BASE_IMAGE
ARG VERSION=0.1.0
ARG GIT_REVISION=unknown
ARG BUILD_DATE=unknown
ARG TORCH_VERSION=2.13.0
ARG CUDA_VERSION=13.0
ARG CUDNN_VERSION=9
ARG NCCL_VERSION=2
ARG PYTHON_VERSION=3.12

LABEL org.opencontainers.image.title="ups" \
      org.opencontainers.image.description="Containerized PyTorch DDP job runner for PDE surrogate models" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.ups.pins.torch="${TORCH_VERSION}" \
      io.ups.pins.cuda="${CUDA_VERSION}" \
      io.ups.pins.cudnn="${CUDNN_VERSION}" \
      io.ups.pins.nccl="${NCCL_VERSION}" \
      io.ups.pins.python="${PYTHON_VERSION}"

# Plain `docker run` runs as uid 1000. The compose files start as root instead, and
# ups-entrypoint switches to the owner of the mounted runs/ (docker/entrypoint.sh).
USER ${UPS_UID}
ENTRYPOINT ["ups-entrypoint", "ups", "launch"]
CMD ["configs/demo.yaml"]
