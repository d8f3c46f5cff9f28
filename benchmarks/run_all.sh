#!/usr/bin/env bash
# `make bench`: every benchmark, each printing ratios measured side by side in one run.
# Results land in benchmarks/results/. The machine is shared and noisy: compare ratios,
# not absolute times. The image and docker-deploy benchmarks need a Docker engine
# (scripts/docker-engine.sh starts one) and are skipped without it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -f data/demo/1D_Advection_Sols_beta0.4.hdf5 ] || .venv/bin/ups data synth
echo "== trainer: 1 vs 2 ranks, loader vs step, peak RSS";  $PY benchmarks/bench_train.py
echo "== trainer step: ups (skip, fail) vs a plain DDP step, fp32/bf16, two sizes"; $PY benchmarks/bench_step.py
echo "== preflight: wall time per check, check vs bare all-reduce"; $PY benchmarks/bench_preflight.py
echo "== deploy: log latency and lines lost across forced disconnects"; $PY benchmarks/bench_deploy.py
echo "== stall watch: hang to exit, the watcher's CPU, step time watched vs not"
$PY benchmarks/bench_stall.py --json benchmarks/results/stall_cpu.json
if bash scripts/docker-engine.sh >/dev/null 2>&1; then
    for b in benchmarks/bench_image.*; do
        [ -e "$b" ] || continue
        echo "== image: size, layers, code-only rebuild delta, compose up to first step"
        case "$b" in *.py) $PY "$b" ;; *.sh) bash "$b" ;; esac
    done
    echo "== deploy (docker kind): bytes for a first deploy vs a code-only redeploy"
    $PY benchmarks/bench_deploy.py --docker
else
    echo "== no Docker engine: image and docker-deploy benchmarks skipped"
fi
