"""Benchmark ups-preflight on this machine.

1. Wall time of a full preflight (in-process ``run_preflight`` and the ``ups-preflight``
   command, imports included) and of each check, median over ``--repeat`` runs.
2. CPU all-reduce bus bandwidth as the check measures it (fresh worker processes, gloo)
   next to a bare ``torch.distributed.all_reduce`` loop over the same sizes, iterations and
   warm-up in already-started processes; the ratio is the check's own overhead.

    .venv/bin/python benchmarks/bench_preflight.py [--config configs/demo.yaml] [--repeat 3]

Prints tables; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ups import jsonio
from ups.log import setup_logging
from ups.preflight import PreflightOptions, run_preflight
from ups.preflight.checks.allreduce import CPU_SIZES, AllReducePlan, execute
from ups.preflight.checks.ports import pick_free_port

ITERS, WARMUP = 5, 2
"""The check's own gloo settings (ups.preflight.checks.allreduce.plan_for); --iters changes both
sides alike to average out a noisy machine."""


def _bare_worker(rank: int, world: int, port: int, sizes: list[int], iters: int, out: Any) -> None:
    torch.set_num_threads(1)  # as the check's workers (OMP_NUM_THREADS=1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=dt.timedelta(seconds=60),
    )  # fmt: skip
    rows = []
    for size in sizes:
        buf = torch.ones(size // 4)
        for _ in range(WARMUP):
            dist.all_reduce(buf)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        algbw = size / float(elapsed) / 1e9
        rows.append({"bytes": size, "busbw_gbps": algbw * 2 * (world - 1) / world})
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def bare_allreduce(world: int, sizes: list[int], iters: int) -> list[dict[str, float]]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = pick_free_port(0, "127.0.0.1")
    mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]  # not re-exported, unannotated
        _bare_worker, args=(world, port, sizes, iters, queue), nprocs=world, start_method="spawn"
    )
    rows: list[dict[str, float]] = queue.get()
    return rows


def check_allreduce(world: int, iters: int) -> tuple[list[dict[str, float]], float]:
    plan = AllReducePlan(
        backend="gloo", world_size=world, port=pick_free_port(0, "127.0.0.1"),
        sizes=CPU_SIZES, iters=iters, warmup=WARMUP, timeout_s=120.0,
    )  # fmt: skip
    run = execute(plan)
    if not run.ok:
        raise RuntimeError(f"all-reduce check failed: {run.error}")
    return run.sizes, run.elapsed_s


def _median_rows(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    return [
        {"bytes": rows[0]["bytes"], "busbw_gbps": statistics.median(r["busbw_gbps"] for r in rows)}
        for rows in zip(*runs, strict=True)
    ]


def time_preflight(config: Path | None, repeat: int) -> dict[str, Any]:
    # 29500 may be held by a real run on a shared machine; time the check on a free port.
    port = pick_free_port(29500)
    per_check: dict[str, list[float]] = {}
    totals, statuses = [], {}
    for _ in range(repeat):
        report = run_preflight(PreflightOptions(config=config, master_port=port))
        totals.append(report.duration_s)
        for r in report.results:
            per_check.setdefault(r.name, []).append(r.duration_s)
            statuses[r.name] = r.status.value
    cli = []
    cmd = [sys.executable, "-m", "ups.preflight.cli", "--json", "--events", "off"]
    cmd += ["--master-port", str(port)]
    if config:
        cmd += ["--config", str(config)]
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False, timeout=300)
        cli.append(time.perf_counter() - start)
    return {
        "in_process_s": statistics.median(totals),
        "cli_s": statistics.median(cli),
        "checks": {
            n: {"median_s": statistics.median(v), "status": statuses[n]}
            for n, v in per_check.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--iters", type=int, default=ITERS, help="timed iterations, both sides")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    setup_logging(stdout=io.StringIO(), console=False)  # keep the tables readable
    config = args.config if args.config.is_file() else None

    pre = time_preflight(config, args.repeat)
    sizes = list(CPU_SIZES)
    load_before = os.getloadavg()[0]
    check_runs, bare_runs, walls = [], [], []
    for _ in range(args.repeat):  # interleaved, so machine load hits both sides alike
        rows, wall = check_allreduce(args.procs, args.iters)
        check_runs.append(rows)
        walls.append(wall)
        bare_runs.append(bare_allreduce(args.procs, sizes, args.iters))
    check_rows = _median_rows(check_runs)
    bare_rows = _median_rows(bare_runs)
    check_elapsed = statistics.median(walls)

    print(f"ups-preflight on {platform.node()} ({os.cpu_count()} CPUs, torch {torch.__version__})")
    print(f"config: {config or '(none)'}; median of {args.repeat} runs; "
          f"load average {load_before:.1f} at the start\n")  # fmt: skip
    print(f"{'check':<10} {'status':<6} {'median s':>9}")
    for name, row in pre["checks"].items():
        print(f"{name:<10} {row['status']:<6} {row['median_s']:>9.3f}")
    print(f"{'TOTAL':<10} {'':<6} {pre['in_process_s']:>9.3f}  (in process)")
    print(f"{'CLI':<10} {'':<6} {pre['cli_s']:>9.3f}  (`ups-preflight --json`, imports included)")
    print(
        f"\ngloo all-reduce, {args.procs} CPU processes, {args.iters} iters after {WARMUP} warm-up"
    )
    print(f"{'size':>9} {'check busbw':>12} {'bare busbw':>11} {'ratio':>6}")
    comparison = []
    for c, b in zip(check_rows, bare_rows, strict=True):
        ratio = c["busbw_gbps"] / b["busbw_gbps"]
        comparison.append({"bytes": c["bytes"], "check_busbw_gbps": c["busbw_gbps"],
                           "bare_busbw_gbps": b["busbw_gbps"], "ratio": ratio})  # fmt: skip
        size = f"{int(c['bytes']) >> 10} KiB"
        print(f"{size:>9} {c['busbw_gbps']:>10.3f} GB/s {b['busbw_gbps']:>6.3f} GB/s {ratio:>6.2f}")
    print(f"check wall time (spawn + init + sweep + teardown): {check_elapsed:.2f} s (median)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(jsonio.dumps({
            "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "config": str(config) if config else None, "repeat": args.repeat, "iters": args.iters,
            "load_average_1m": load_before,
            "preflight": pre, "allreduce": comparison, "allreduce_check_wall_s": check_elapsed,
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
