#!/usr/bin/env bash
# Write docker/requirements.lock with uv: ups's runtime dependencies from pyproject.toml,
# except those [tool.ups.image] leave_out names (torch: the base image has it, with its own
# dependencies; runpod: the laptop's SDK, which nothing in the image imports: the reasons
# are beside the list), plus setuptools (the image builds ups without the network). One universal resolution for every Python from
# 3.11 up (the CPU image runs 3.11, the official GPU image 3.12), every file hashed, so
# the Dockerfile's `pip install --require-hashes` installs exactly these files.
#
#   docker/lock.sh                  # rewrite the lock, keeping the versions it already pins
#   docker/lock.sh --upgrade        # newest versions pyproject.toml allows
#   docker/lock.sh -o OTHER.lock    # write elsewhere (tests/test_docker_static.py: is it current?)
#
# uv is in the dev extras (.venv/bin/uv); UV=/path/to/uv picks another. EXCLUDE_NEWER makes
# the resolution repeatable: files uploaded later are not seen. Move it forward to upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

EXCLUDE_NEWER=2026-11-25T00:00:00Z
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
out=docker/requirements.lock
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out=$2; shift ;;
        --upgrade) args+=(--upgrade) ;;
        *) echo "lock.sh: unknown option $1 (use -o FILE, --upgrade)" >&2; exit 2 ;;
    esac
    shift
done

python3 - <<'EOF' | "$UV" pip compile - --quiet --universal --python-version 3.11 \
    --generate-hashes --exclude-newer "$EXCLUDE_NEWER" --custom-compile-command docker/lock.sh \
    --no-config -o "$out" "${args[@]}"
import re
import tomllib

pyproject = tomllib.load(open("pyproject.toml", "rb"))
leave_out = set(pyproject["tool"]["ups"]["image"]["leave_out"])
for raw in pyproject["project"]["dependencies"]:
    if re.split(r"[^A-Za-z0-9._-]", raw, maxsplit=1)[0] not in leave_out:
        print(raw)
print(*(r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")))
EOF
