"""How fast `fab` answers: `fab --list` and `fab status` on a host that refuses the
connection, side by side with `python -c pass` (the floor for starting any Python tool).

    .venv/bin/python benchmarks/bench_fab.py [--repeat 7] [--repo PATH]

``--repo`` times another checkout of ups (e.g. ``git worktree add /tmp/before a929b2d``)
with this interpreter: the commands run in that directory with it first on PYTHONPATH.
The three commands take turns in every round, so machine load hits them alike. Prints
one JSON object: seconds (median, min, max) per command and each median's ratio to the
``python -c pass`` median.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=300)
    return time.perf_counter() - start, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout to time (default: this)")
    args = ap.parse_args()
    repo = args.repo.resolve()
    fab = str(Path(sys.executable).with_name("fab"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-fab-"))
    hosts = tmp / "hosts.yaml"
    hosts.write_text(
        f"known_hosts: {tmp / 'known_hosts'}\n"
        f"hosts:\n  down:\n    host: 127.0.0.1\n    port: {_closed_port()}\n"
        "    user: root\n    workdir: /w\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo)}
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "fab --list": [fab, "--list"],
        "fab status (refused)": [fab, "status", "--host", "down", "--hosts-file", str(hosts)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    for _ in range(args.repeat):
        for name, argv in commands.items():
            seconds, code = _time(argv, repo, env)
            times[name].append(seconds)
            codes[name].add(code)
    floor = statistics.median(times["python -c pass"])
    result = {
        "repo": str(repo),
        "repeat": args.repeat,
        "commands": {
            name: {
                "median_s": round(statistics.median(ts), 3),
                "min_s": round(min(ts), 3),
                "max_s": round(max(ts), 3),
                "ratio_to_python": round(statistics.median(ts) / floor, 1),
                "exit_codes": sorted(codes[name]),
            }
            for name, ts in times.items()
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
