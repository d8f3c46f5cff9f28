"""N `ups launch` on one host at once: how many start and finish, wall time vs one launch.

Each launch is the demo config cut to a few steps, 2 gloo ranks, full preflight, all with
the same configured master port (what a sweep of copies of one config does). First one
launch alone, then N started in the same instant; each repeat does both.

    .venv/bin/python benchmarks/bench_concurrent_launch.py --n 3 --repeats 2 \\
        --json benchmarks/results/concurrent_launch.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ups import jsonio

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _launches(config: Path, out: Path, n: int, tag: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPS_", "WANDB_"))}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline")
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ups",
                "launch",
                str(config),
                "--run-id",
                f"{tag}{i}",
                "--output-dir",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(n)
    ]
    outputs = [p.communicate(timeout=1200)[0] for p in procs]
    wall = time.monotonic() - start
    started = sum('"train_step"' in o for o in outputs)
    finished = sum(p.returncode == 0 for p in procs)
    addr_in_use = sum("EADDRINUSE" in o or "address already in use" in o.lower() for o in outputs)
    return {
        "n": n,
        "wall_s": round(wall, 1),
        "started": started,
        "finished": finished,
        "eaddrinuse": addr_in_use,
        "exit_codes": [p.returncode for p in procs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"concurrent launches - {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="ups-bench-par-") as tmp:
        root = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "ups", "data", "synth", "--out", str(root / "data/demo")],
            check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
        cfg = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())
        for task in cfg["tasks"]:
            task["path"] = str(root / task["path"])
        cfg["training"].update(max_steps=args.steps, epochs=1)
        cfg["distributed"]["master_port"] = _free_port()
        config = root / "bench.yaml"
        config.write_text(yaml.safe_dump(cfg))
        for r in range(args.repeats):
            one = _launches(config, root / "runs", 1, f"one{r}-")
            many = _launches(config, root / "runs", args.n, f"par{r}-")
            rows.append({"one": one, "many": many})
            print(
                f"repeat {r}: 1 launch {one['wall_s']} s; {args.n} at once {many['wall_s']} s "
                f"({many['wall_s'] / one['wall_s']:.2f}x), started {many['started']}/{args.n}, "
                f"finished {many['finished']}/{args.n}, EADDRINUSE {many['eaddrinuse']}"
            )
    if args.json:
        result = {"load": load, "steps": args.steps, "n": args.n, "repeats": rows}
        args.json.write_text(jsonio.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
