#!/usr/bin/env bash
# ups's supported torch range (docs/gpu.md "The torch range"), each end in a virtualenv of
# its own, never the main .venv:
#   bash scripts/torch-range.sh install [VENV]   # the oldest release (CI: .venv-torch-oldest)
#   bash scripts/torch-range.sh newest [VENV]    # the newest release: install, run, record
#
# install: torch TORCH (default: the oldest supported minor, its newest patch, from
# ups/torchcompat.py SUPPORTED_TORCH) first, then ups and its dev extras, which keep that
# torch (pyproject.toml admits the whole range). PyPI's Linux wheels are CUDA builds (the
# torch wheel and about 3 GB of nvidia-* libraries); they run on a CPU. Idempotent: a venv
# whose stamp names the same torch and pyproject.toml is kept. One install at a time per
# venv (a lock beside it), so scripts/test.sh can start it in the background and the tests
# that need it (tests/test_torch_range.py) wait on the same lock.
#
# newest: the same for the newest release the range admits (TORCH, default 2.15.0), past
# this machine's pip constraint (it caps torch at 2.14.1: PIP_CONSTRAINT=/dev/null for the
# install only), then the quick tier, a 2-rank run stopped and resumed, and preflight under
# it (tests/test_torch_range.py with UPS_TORCH_VENV pointing at it); the summary goes to
# benchmarks/results/torch-newest-DATE.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3.11}
what=${1:-install}

oldest() {
    # "2.11" -> "2.11.*": the newest patch release of the oldest supported minor.
    "$PY" -c 'import ast, pathlib, re
src = pathlib.Path("ups/torchcompat.py").read_text()
print(ast.literal_eval(re.search(r"SUPPORTED_TORCH = (\(.*?\))", src).group(1))[0] + ".*")'
}

install() {  # VENV TORCH_SPEC [pip environment...]
    local venv=$1 spec=$2
    shift 2
    # A release outside the range is refused before 3 GB are downloaded for it.
    "$PY" -c 'import sys; sys.path.insert(0, ".")
from ups.torchcompat import in_supported_range, supported_range_text
if not in_supported_range(sys.argv[1].replace("*", "0")):
    sys.exit(f"torch-range: torch {sys.argv[1]} is outside ups'"'"'s supported range "
             f"torch{supported_range_text()} (ups/torchcompat.py); pick a release inside it")' "$spec"
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    flock 9
    local stamp="$venv/.ups-installed"
    local want
    want="torch==$spec $(sha256sum pyproject.toml | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        echo "torch-range: $venv has $want"
        return 0
    fi
    echo "torch-range: installing torch==$spec into $venv"
    test -x "$venv/bin/pip" || "$PY" -m venv --clear "$venv"
    # uv (the version the dev extras pin) does the installing: about 3 GB of wheels, which
    # pip unpacked with 112 CPU-seconds, in the background of a CPU-bound test run.
    # Bytecode compiled at install, as pip does.
    env "$@" "$venv/bin/pip" install --quiet "uv==$(make --no-print-directory -s uv-version)"
    local uv=("$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python")
    env "$@" "${uv[@]}" "torch==$spec"
    # The same extras as `make venv`; uv keeps the torch above (it is inside the range).
    env "$@" "${uv[@]}" -e ".[dev]"
    "$venv/bin/python" -c 'import torch, ups.torchcompat as c
assert c.in_supported_range(torch.__version__), torch.__version__
print("torch-range:", torch.__version__, "in", c.supported_range_text())'
    echo "$want" >"$stamp"
}

case "$what" in
install)
    venv=${2:-.venv-torch-oldest}
    install "$venv" "${TORCH:-$(oldest)}"
    ;;
newest)
    venv=${2:-/tmp/ups-torch-newest}
    version=${TORCH:-2.15.0}
    start=$(date +%s)
    install "$venv" "$version" PIP_CONSTRAINT=/dev/null
    installed=$(($(date +%s) - start))
    out="benchmarks/results/torch-newest-$(date -u +%Y-%m-%d).txt"
    log=$(mktemp)
    set +e
    UPS_TORCH_VENV="$venv" .venv/bin/pytest -q -p no:cacheprovider -rfEs \
        tests/test_torch_range.py >"$log" 2>&1
    rc=$?
    set -e
    {
        echo "ups on the newest torch in its range - $(date -u '+%Y-%m-%d %H:%M') UTC"
        echo "command: bash scripts/torch-range.sh newest $venv (TORCH=$version)"
        echo "torch: $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')"
        echo "install: ${installed} s (0 when the venv was already there)"
        echo "tests/test_torch_range.py (quick tier, 2-rank launch stopped and resumed, preflight): exit $rc"
        tail -n 15 "$log"
    } | tee "$out"
    rm -f "$log"
    exit "$rc"
    ;;
*)
    echo "usage: bash scripts/torch-range.sh install [VENV] | newest [VENV]" >&2
    exit 2
    ;;
esac
