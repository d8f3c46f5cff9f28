#!/usr/bin/env bash
# Wheels for the GPU machine (docs/gpu.md): what the GPU suite needs that its image lacks,
# for CPython 3.12 manylinux x86_64, into .gpu-wheels (git-ignored) or the folder given.
# Fails (exit 1) when they and the working tree pass the 64 MiB a device call carries;
# prints the one device call that runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" scripts/gpu_wheels.py "$@"
