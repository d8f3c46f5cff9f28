"""Do two ranks that ``print()`` keep their lines whole on the way to the console and launch.log?

Each of 2 ranks prints N lines ``r<rank> <i> xxx...`` with plain ``print()`` (torchrun runs
workers with ``python -u``: the text and the newline are two writes). Side by side:

- ``pipe``: bare ``torchrun --standalone``, every rank writing into the one stdout pipe
  (what ``ups launch`` did before it captured ranks separately);
- ``ups``: ``ups launch --script`` (each rank's output in its own file, merged whole lines
  at a time), counted in its stdout and in launch.log.

A line is corrupt when it is not exactly one rank's line; a line is missing when a
(rank, i) pair never arrives whole. Reported per 100,000 lines, each mode repeated.

    .venv/bin/python benchmarks/bench_launch_lines.py --lines 50000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import os, sys
rank = int(os.environ["RANK"])
pad = "x" * 80
for i in range(int(sys.argv[1])):
    print(f"r{rank} {i:07d} {pad}")
"""
LINE = re.compile(r"^r([01]) (\d{7}) x{80}$")


def _count(text: str, n: int) -> tuple[int, int, int]:
    """(corrupt lines, missing lines, rank lines seen) in ``text``."""
    seen: set[tuple[str, str]] = set()
    corrupt = 0
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            seen.add((m[1], m[2]))
        elif "x" * 20 in line or re.search(r"r[01] \d{7}", line):
            corrupt += 1  # a rank's text, but not one whole line of it
    return corrupt, 2 * n - len(seen), len(seen)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "UPS_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_pipe(script: Path, n: int) -> dict[str, float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(n)],
        capture_output=True, text=True, env=_env(), check=True,
    ).stdout  # fmt: skip
    corrupt, missing, _ = _count(out, n)
    return {"s": time.monotonic() - start, "corrupt": corrupt, "missing": missing}


def run_ups(script: Path, n: int, runs: Path) -> dict[str, float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "ups", "launch", "--script", str(script), "--output-dir",
         str(runs), "--fresh", "--skip-preflight", "--log-format", "json", "--", str(n)],
        capture_output=True, text=True, env=_env(), cwd=REPO, check=True,
    ).stdout  # fmt: skip
    log = (runs / "latest" / "logs" / "launch.log").read_text()
    corrupt, missing, _ = _count(out, n)
    log_corrupt, log_missing, _ = _count(log, n)
    return {
        "s": time.monotonic() - start,
        "corrupt": corrupt,
        "missing": missing,
        "log_corrupt": log_corrupt,
        "log_missing": log_missing,
    }


def _per_100k(values: list[float], n: int) -> str:
    scaled = [v * 100_000 / (2 * n) for v in values]
    spread = f" (min {min(scaled):.0f}, max {max(scaled):.0f})" if len(scaled) > 1 else ""
    return f"{statistics.median(scaled):.0f}{spread}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=50_000, help="lines per rank")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    n = args.lines
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "prints.py"
        script.write_text(SCRIPT)
        pipe = [run_pipe(script, n) for _ in range(args.repeats)]
        ups = [run_ups(script, n, Path(tmp) / "runs") for _ in range(args.repeats)]
    print(f"2 ranks x {n} print() lines, {args.repeats} repeats; per 100,000 lines, median:")
    print(
        f"  bare torchrun, shared pipe: corrupt {_per_100k([r['corrupt'] for r in pipe], n)}, "
        f"missing {_per_100k([r['missing'] for r in pipe], n)}, "
        f"{statistics.median(r['s'] for r in pipe):.1f} s"
    )
    print(
        f"  ups launch --script stdout: corrupt {_per_100k([r['corrupt'] for r in ups], n)}, "
        f"missing {_per_100k([r['missing'] for r in ups], n)}, "
        f"{statistics.median(r['s'] for r in ups):.1f} s"
    )
    print(
        f"  ups launch launch.log:      corrupt {_per_100k([r['log_corrupt'] for r in ups], n)}, "
        f"missing {_per_100k([r['log_missing'] for r in ups], n)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
