"""Download the wheels the GPU suite needs that the GPU machine lacks (docs/gpu.md).

    bash scripts/gpu-wheels.sh [DEST]     # default .gpu-wheels (git-ignored)

Resolves ups's dependencies that the GPU machine does not have, with their own
dependencies, for CPython 3.12 manylinux x86_64; keeps only the wheels of projects the
machine lacks (never torch, triton or nvidia-*); checks that they and the working tree
that travels with them stay under the device's 64 MiB (exit 1, naming the largest wheels,
if not); prints the one device call that runs the suite there.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 << 20
"""What travels with one device call: the working tree plus the carried folders."""
ON_GPU_MACHINE = frozenset(
    line.strip()
    for line in (REPO / "scripts" / "gpu_machine_packages.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
"""Python packages the GPU machine's image holds (listed in that file with their source)."""
NEVER = ("torch", "triton", "nvidia-")
NOT_FOR_THE_SUITE = frozenset({"boto3", "botocore", "runpod"})
"""Dependencies no suite step imports (ups imports each lazily, where it is used): boto3
and botocore (17 MB) only serve ``checkpoint_sync: s3://``, which the suite does not set;
runpod (with fastapi, uvicorn, aiohttp) only the runpod host kind. Carrying them would
pass 64 MiB."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_34_x86_64",
             "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64",
             "manylinux_2_5_x86_64")  # fmt: skip


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needed_requirements() -> list[str]:
    """pyproject's dependencies whose project the GPU machine does not have."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    name = re.compile(r"^[A-Za-z0-9._-]+")
    skip = ON_GPU_MACHINE | NOT_FOR_THE_SUITE
    return [d for d in deps if canonical(name.match(d).group()) not in skip]  # type: ignore[union-attr]  # every entry starts with a name


def wheel_project(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def tree_bytes() -> int:
    """Bytes of what a device call sends besides the carried folders: tracked files and
    untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum(
        (REPO / p.decode()).stat().st_size for p in listed if p and (REPO / p.decode()).is_file()
    )


def download(dest: Path) -> list[Path]:
    requirements = needed_requirements()
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", tmp]  # fmt: skip
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        proc = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"gpu-wheels: pip download failed for {requirements}:\n{proc.stderr[-3000:]}")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        kept = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            project = wheel_project(wheel)
            if project in ON_GPU_MACHINE or project.startswith(NEVER):
                continue
            kept.append(Path(shutil.copy2(wheel, dest / wheel.name)))
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path, default=REPO / ".gpu-wheels")
    args = parser.parse_args()
    dest = args.dest.resolve()
    wheels = download(dest)
    wheel_bytes = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes()
    print(f"{len(wheels)} wheels, {wheel_bytes / 2**20:.1f} MiB in {dest}; working tree "
          f"{tree / 2**20:.1f} MiB; together {(wheel_bytes + tree) / 2**20:.1f} MiB of the "
          f"{LIMIT_BYTES >> 20} MiB a device call carries")  # fmt: skip
    if wheel_bytes + tree > LIMIT_BYTES:
        largest = sorted(wheels, key=lambda w: w.stat().st_size, reverse=True)[:5]
        sizes = ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f} MiB" for w in largest)
        print(f"gpu-wheels: OVER THE LIMIT: {(wheel_bytes + tree) / 2**20:.1f} MiB > "
              f"{LIMIT_BYTES >> 20} MiB; the device call would be refused. Largest: {sizes}. "
              "Leave out a dependency the suite does not import, or shrink the tree.",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        carry = str(dest.relative_to(REPO))
    except ValueError:
        carry = str(dest)
    print("\nThe one device call (tool device, verb run):")
    print(f'  command: "bash scripts/gpu-suite.sh --wheels {carry}"')
    print(f'  carry:   ["{carry}"]')
    print("  timeout_s: 600   (the suite keeps to --budget-s 560)")
    print("It brings back from $OUT: gpu-suite.json, gpu-step.txt, gpu-suite.log.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
