#!/usr/bin/env bash
# The GPU suite (docs/gpu.md): every CUDA path of ups, each step under a deadline and
# independent of the others, results as JSON in benchmarks/results/ and $OUT.
#   bash scripts/gpu-suite.sh                 # on the GPU machine, with .gpu-wheels carried
#   bash scripts/gpu-suite.sh --cpu           # anywhere: CUDA-only steps say "skipped: no CUDA"
# Python: this checkout's .venv when there is one, else python3 (the GPU machine's, with its
# own torch, which nothing here installs or upgrades).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_suite.py "$@"
