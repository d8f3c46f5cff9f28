#!/usr/bin/env python3
"""Regenerate the CPU image size the README quotes from a real build.

    scripts/build-images.sh && .venv/bin/python scripts/readme-image.py      # rewrite README.md
    .venv/bin/python scripts/readme-image.py --check     # exit 1 when the README is off

Reads ``docker image inspect`` and ``docker history`` of the image (``UPS_IMAGE_CPU``,
default ups:cpu) and splits it into the base, the dependency layer (the lock's
``pip install``) and everything else (user, source, ups itself). Rewrites what lies
between the ``readme-image`` markers in README.md. ``--check`` allows 1 MB either way on
each number, so that a small change in ``ups/`` does not call for a new capture; a new
base or lock does. tests/test_docker_e2e.py runs ``--check`` on the image it builds.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKERS = re.compile(r"(<!-- readme-image -->)(.*?)(<!-- /readme-image -->)", re.S)
DEPS_STEP = "pip install --require-hashes -r requirements.lock"
MB = 1e6
TOLERANCE_MB = 1.0


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def measure(image: str) -> dict[str, float]:
    """MB of the whole image, its base (the layers of the FROM image), the dependency layer
    and the rest."""
    total = int(_docker("image", "inspect", "-f", "{{.Size}}", image))
    base_name = _docker(
        "image", "inspect", "-f", '{{index .Config.Labels "org.opencontainers.image.base.name"}}',
        image,
    ).strip()  # fmt: skip
    base = int(_docker("image", "inspect", "-f", "{{.Size}}", base_name))
    history = _docker("history", "--no-trunc", "--human=false", "--format",
                      "{{.Size}}\t{{.CreatedBy}}", image).splitlines()  # fmt: skip
    deps = [int(line.split("\t")[0]) for line in history if DEPS_STEP in line]
    if len(deps) != 1:
        raise SystemExit(f"{image}: no single layer made by `{DEPS_STEP}` in its history")
    return {
        "total": total / MB,
        "base": base / MB,
        "deps": deps[0] / MB,
        "rest": (total - base - deps[0]) / MB,
    }


def render(mb: dict[str, float]) -> str:
    return (
        f"{mb['total']:.0f} MB: base {mb['base']:.0f} MB, dependencies {mb['deps']:.0f} MB, "
        f"source and install {mb['rest']:.1f} MB"
    )


def quoted(text: str) -> dict[str, float]:
    """The numbers the README quotes between the markers."""
    found = MARKERS.search(text)
    if not found:
        raise SystemExit("README.md has no <!-- readme-image --> ... <!-- /readme-image -->")
    numbers = re.findall(r"([\d.]+) MB", found.group(2))
    return dict(zip(("total", "base", "deps", "rest"), map(float, numbers), strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is off")
    parser.add_argument("--image", default=os.environ.get("UPS_IMAGE_CPU", "ups:cpu"))
    args = parser.parse_args(argv)
    mb = measure(args.image)
    text = README.read_text()
    if args.check:
        have = quoted(text)
        off = [k for k in mb if abs(have[k] - mb[k]) > TOLERANCE_MB]
        if off:
            sys.stderr.write(
                f"README.md quotes {render(have)} for the CPU image; {args.image} measures "
                f"{render(mb)} ({', '.join(off)} off by more than {TOLERANCE_MB:.0f} MB). "
                "Run .venv/bin/python scripts/readme-image.py to rewrite it.\n"
            )
            return 1
        print(f"README.md matches {args.image}: {render(mb)}")
        return 0
    README.write_text(MARKERS.sub(lambda m: m.group(1) + render(mb) + m.group(3), text, 1))
    print(f"README.md: {render(mb)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
