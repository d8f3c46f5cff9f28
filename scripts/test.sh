#!/usr/bin/env bash
# The test command (`make test`): lint, type-check, then every test tier that can run here.
# System services the tests use (a Docker engine, sshd) are installed and started by
# scripts/docker-engine.sh and scripts/sshd-setup.sh, which this script runs first.
# GPU tests are skipped without CUDA; on a GPU host `pytest -m gpu` runs them. Any other
# skip fails the run (tests/conftest.py collects skip reasons): a test that did not run is
# not a pass. The docker tests share one build of ups:cpu per run (conftest `ups_image`,
# once across the xdist workers too).
#
# Tests run side by side (pytest-xdist). UPS_TEST_WORKERS (default 4) sets the worker
# count: 6 made every test 1.5x slower and the run no shorter, since the suite is bound by
# the CPU (counting the processes of containers and FAKE Vast instances, which `time`
# does not see). `--dist loadgroup` hands out one test at a time, except a module marked
# `xdist_group` (an expensive module-scoped fixture: private Docker engines, shared
# training runs), whose tests stay on one worker; tests/scheduling.py hands out the
# longest first (tests/durations.json, `make test-durations`), so no long test starts
# last. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

# First, as it takes longest and needs only the network: the oldest supported torch in a
# venv of its own (.venv-torch-oldest: the torch wheel and ~3 GB of CUDA libraries from
# PyPI, about 4 minutes), installed in the background and never waited for here: only
# tests/test_torch_range.py needs it, and its fixture waits on the install's lock (or runs
# the install itself, and fails naming what went wrong).
bash scripts/torch-range.sh install .venv-torch-oldest >.venv-torch-oldest.log 2>&1 &
range_pid=$!
trap 'kill "$range_pid" 2>/dev/null || true' EXIT  # a set-up step failed: stop it

echo "== system services: sshd, Docker engine; a C++ compiler for torch.compile"
bash scripts/sshd-setup.sh
if ! command -v g++ >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    # tests/test_train_precision.py compiles a model: inductor's CPU backend builds C++.
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        build-essential >/dev/null
fi
if ! bash scripts/docker-engine.sh; then
    echo "test.sh: the Docker engine could not be started (log above); the container tests" \
        "need it, so this run would fail. Fix the engine, then run the tests again." >&2
    exit 1
fi

# The docker tests' image, built while the linters run: the build mostly waits on disk
# and the engine. The docker tests' fixture (conftest `ups_image`) builds again under a
# file lock, which the layer cache makes seconds, so no xdist worker waits minutes for it.
build_log=$(mktemp)
bash scripts/build-images.sh >"$build_log" 2>&1 &
build_pid=$!
# Slurm (slurmctld, slurmd, munge from Debian) for the `kind: slurm` tests, installed
# meanwhile too; their fixture (tests/slurm_fixtures.py) starts the two-node cluster.
slurm_log=$(mktemp)
bash scripts/slurm-setup.sh install >"$slurm_log" 2>&1 &
slurm_pid=$!
trap 'kill "$build_pid" "$slurm_pid" "$range_pid" 2>/dev/null || true' EXIT  # a linter failed

echo "== ruff"
$BIN/ruff check .
echo "== lint coverage (nothing skipped by ruff or mypy)"
$BIN/python scripts/lint_coverage.py
echo "== mypy"
$BIN/mypy
echo "== import contract (pyproject.toml [tool.importlinter]: imports only go downward)"
$BIN/lint-imports --no-cache
echo "== docs site (sphinx -W: a broken link or anchor, a missing page fails; make docs serves it)"
docs_out=$(mktemp -d)
$BIN/sphinx-build -W --keep-going -n -q -b html docs "$docs_out"
rm -rf "$docs_out"
echo "== the ups:cpu image (built in the background since the linters started)"
if ! wait "$build_pid"; then
    tail -n 40 "$build_log" >&2
    echo "test.sh: scripts/build-images.sh failed (log above); the docker tests need the" \
        "image, so this run would fail. Fix the build, then run the tests again." >&2
    exit 1
fi
rm -f "$build_log"
echo "== Slurm (installed in the background since the linters started)"
if ! wait "$slurm_pid"; then
    tail -n 40 "$slurm_log" >&2
    echo "test.sh: scripts/slurm-setup.sh install failed (log above); the slurm tests need" \
        "it, so this run would fail. Fix the install, then run the tests again." >&2
    exit 1
fi
rm -f "$slurm_log"
trap - EXIT
echo "== pytest"
exec $BIN/pytest -ra -q --durations=15 -n "${UPS_TEST_WORKERS:-4}" --dist loadgroup \
    --no-loadscope-reorder "$@"
