# The ups image: the pinned PyTorch runtime plus ups. ENTRYPOINT is `ups launch`
# (preflight, then torchrun). Build with scripts/build-images.sh, which fills in the
# labels from pins.toml and git; docs/docker.md explains the layers.
#
#   GPU (default base):  docker build -t ups:gpu .
#   CPU (local base):    docker build --build-arg BASE_IMAGE=ups-base-cpu:... -t ups:cpu .
#
# The base must provide `python` (3.11) with torch on PATH: the official image does
# (/opt/conda), and so does the CPU stand-in from docker/base-cpu.sh (/opt/venv).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:db80a41f8428644cebcb3d75b0b62df334ab6c0e75785951eb25f48bfbd42407
FROM ${BASE_IMAGE}

ARG UPS_UID=1000

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

# Dependencies layer: changes only when pyproject.toml or the lock changes. Empty stub
# packages let pip resolve the project's dependencies before the source is copied.
COPY pyproject.toml docker/requirements.lock ./
RUN mkdir -p ups \
    && touch ups/__init__.py \
    && python -m pip install --constraint requirements.lock . \
    && python -m pip uninstall --yes ups \
    && rm -rf ups build ./*.egg-info \
    && python -c "import torch; print('torch', torch.__version__)"

# Source layers: a one-line change in ups/ rebuilds only these small layers.
COPY configs/ configs/
COPY pins.toml ./
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
ARG PYTHON_VERSION=3.11

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
