#!/usr/bin/env bash
# The test command (`make test`): every test tier that can run here, with the linters, the
# type check, the import contract and the strict docs build beside the tests.
# GPU tests are skipped without CUDA; on a GPU host `pytest -m gpu` runs them. Any other
# skip fails the run (tests/conftest.py collects skip reasons): a test that did not run is
# not a pass.
#
# Installs run in the background, off the critical path. What the tests need from the
# system (sshd, the Docker engine and the ups:cpu image, Slurm, a C++ compiler) is started
# first, as named background jobs, and the venv and the tests that need none of it run
# meanwhile. A test waits only for the jobs it needs, by name:
#
#   background NAME [--after OTHER] CMD...   (this script) starts CMD now, or once OTHER
#       has ended (apt jobs queue behind each other: dpkg takes one at a time); its output
#       goes to $UPS_BACKGROUND_DIR/NAME.log, its exit status to NAME.rc, its seconds to
#       NAME.s (NAME.started and NAME.ended: when it was asked for and when it ended).
#   @pytest.mark.background("NAME")  (tests/background.py) on a test: the test waits for
#       NAME before it starts and fails, with the log's tail, when NAME failed. The markers
#       `ssh` and `docker` imply the jobs `sshd` and `docker`, the fixture `ups_image` the
#       job `ups-image`; the functions that start those resources (spawn_sshd, the engines,
#       the image and Slurm fixtures) also wait by name, so a module-scoped fixture never
#       starts before its install ended.
#
# Adding a tier is one `background` line below and the marker on its tests. The scheduler
# (tests/scheduling.py) starts the tests that need nothing first and the others once
# their jobs should have ended (from the seconds each job took last time, kept in
# tests/durations.json by `make test-durations`). Run alone (`pytest tests/...`), nothing
# is started in the background and each fixture installs what it needs itself.
#
# Tests run side by side (pytest-xdist). UPS_TEST_WORKERS (default 4) sets the worker
# count: 6 made every test 1.5x slower and the run no shorter, since the suite is bound by
# the CPU (counting the processes of containers and FAKE Vast instances, which `time`
# does not see). `--dist loadgroup` hands out one test at a time, except a module marked
# `xdist_group` (an expensive module-scoped fixture: private Docker engines, shared
# training runs), whose tests stay on one worker; tests/scheduling.py hands out the
# longest first (tests/durations.json, `make test-durations`), so no long test starts
# last. Extra arguments go to pytest. The end of the output is the report: the slowest
# tests, each phase's seconds and the total.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
started=$SECONDS
phases=()
phase() { phases+=("$(printf '%-44s %5d s' "$1" $((SECONDS - $2)))"); }

UPS_BACKGROUND_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ups-background.XXXXXX")
export UPS_BACKGROUND_DIR
background() {  # background NAME [--after OTHER] CMD...
    local name=$1 after=""
    shift
    if [ "$1" = --after ]; then after=$2; shift 2; fi
    date +%s >"$UPS_BACKGROUND_DIR/$name.started"
    (
        set +e
        if [ -n "$after" ]; then  # until OTHER ended (or died without a status)
            until [ -e "$UPS_BACKGROUND_DIR/$after.rc" ] \
                || ! kill -0 "$(cat "$UPS_BACKGROUND_DIR/$after.pid")" 2>/dev/null; do
                sleep 1
            done
        fi
        start=$SECONDS
        "$@" >"$UPS_BACKGROUND_DIR/$name.log" 2>&1 </dev/null
        rc=$?
        echo $((SECONDS - start)) >"$UPS_BACKGROUND_DIR/$name.s"
        date +%s >"$UPS_BACKGROUND_DIR/$name.ended"
        echo "$rc" >"$UPS_BACKGROUND_DIR/$name.rc.tmp"
        mv "$UPS_BACKGROUND_DIR/$name.rc.tmp" "$UPS_BACKGROUND_DIR/$name.rc"
    ) &
    echo $! >"$UPS_BACKGROUND_DIR/$name.pid"
}

cxx() {  # tests/test_train_precision.py compiles a model: inductor's CPU backend builds C++.
    if command -v g++ >/dev/null 2>&1 && command -v cc >/dev/null 2>&1; then return 0; fi
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        build-essential >/dev/null
}

echo "== background: sshd, the Docker engine and ups:cpu, Slurm, a C++ compiler, the oldest torch ($UPS_BACKGROUND_DIR)"
# The oldest supported torch in a venv of its own (tests/test_torch_range.py): the wheel and
# ~3 GB of CUDA libraries from PyPI, network-bound, so it starts first.
background torch-oldest bash scripts/torch-range.sh install .venv-torch-oldest
background sshd bash scripts/sshd-setup.sh
background docker --after sshd bash scripts/docker-engine.sh
background ups-image --after docker bash scripts/build-images.sh
background slurm --after docker bash scripts/slurm-setup.sh install
background cxx --after slurm cxx

report() {
    local name seconds state keep=0
    echo "== report"
    if [ -e "$UPS_BACKGROUND_DIR/slowest.txt" ]; then cat "$UPS_BACKGROUND_DIR/slowest.txt"; fi
    for line in "${phases[@]}"; do echo "$line"; done
    for pidfile in "$UPS_BACKGROUND_DIR"/*.pid; do
        name=$(basename "$pidfile" .pid)
        if [ -e "$UPS_BACKGROUND_DIR/$name.rc" ]; then
            seconds=$(cat "$UPS_BACKGROUND_DIR/$name.s")
            state="exit $(cat "$UPS_BACKGROUND_DIR/$name.rc")"
            [ "$state" = "exit 0" ] || { keep=1; state="$state (log $UPS_BACKGROUND_DIR/$name.log)"; }
        else
            seconds=$((SECONDS - started))
            state="still running; it ends on its own (log $UPS_BACKGROUND_DIR/$name.log)"
            keep=1
        fi
        printf '%-44s %5d s  %s\n' "background $name" "$seconds" "$state"
    done
    printf '%-44s %5d s\n' "total (make test)" $((SECONDS - started))
    # CPU of this script's processes (linters, the tests, their torchrun ranks, sshd sessions,
    # the background jobs); not the Docker engine's containers or other daemons.
    times >"$UPS_BACKGROUND_DIR/times"  # a builtin's redirect: no subshell, the children's line
    tail -n 1 "$UPS_BACKGROUND_DIR/times" \
        | awk '{print "CPU of the processes it waited for (user, system): " $1 ", " $2}'
    [ "$keep" = 1 ] || rm -rf "$UPS_BACKGROUND_DIR"  # the logs stay only when one is needed
}
trap report EXIT

t=$SECONDS
make --no-print-directory venv
phase "venv (.venv, in the foreground)" "$t"

# The linters and the strict docs build need only the venv: they run beside the tests
# (about 40 CPU-seconds that no longer hold the tests back) and their verdict comes after
# pytest's: their output is printed there, and a failure fails the run.
lint() (
    set -e
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
)
background lint lint

t=$SECONDS
echo "== pytest"
date +%s >"$UPS_BACKGROUND_DIR/pytest.started"
set +e
$BIN/pytest -ra -q -n "${UPS_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
set -e
phase "pytest" "$t"

t=$SECONDS
until [ -e "$UPS_BACKGROUND_DIR/lint.rc" ] || ! kill -0 "$(cat "$UPS_BACKGROUND_DIR/lint.pid")" 2>/dev/null; do
    sleep 1
done
phase "waiting for the linters after pytest" "$t"
cat "$UPS_BACKGROUND_DIR/lint.log"
if [ "$(cat "$UPS_BACKGROUND_DIR/lint.rc" 2>/dev/null)" != 0 ]; then
    echo "== the linters or the docs build failed (their output is above)"
    [ "$rc" != 0 ] || rc=1
fi
exit "$rc"
