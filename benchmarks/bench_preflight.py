"""Benchmark ups-preflight on this machine.

1. Wall time of a full preflight (in-process ``run_preflight`` and the ``ups-preflight``
   command, imports included) and of each check, median over ``--repeat`` runs.
2. CPU all-reduce bus bandwidth as the check measures it (fresh worker processes, gloo)
   next to a bare ``torch.distributed.all_reduce`` loop over the same sizes, iterations and
   warm-up in already-started processes; the ratio is the check's own overhead.

    .venv/bin/python benchmarks/bench_preflight.py [--config configs/demo.yaml] [--repeat 3]

3. ``--compare REF``: this checkout's ``ups-preflight`` against the code at git ``REF``
   (extracted with ``git archive``, ``data/`` linked in), alternating ABAB, ``--repeat``
   rounds: the wall time of the whole command on the demo config (all-reduce included),
   the disk and all-reduce checks inside it, and the wall time and exit code of a bad
   config (``ups launch`` on the same file for reference). Median (min-max).

    .venv/bin/python benchmarks/bench_preflight.py --compare dc36953 --repeat 5 \
        --json benchmarks/results/preflight_before_after_cpu.json

Prints tables; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


REPO = Path(__file__).resolve().parents[1]
BAD_CONFIG = "training:\n  batch_size: 0\n  epochz: 3\n"
"""A config ``ups launch`` refuses with exit 2: a value out of range and an unknown key."""


def _source_tree(ref: str, where: Path) -> Path:
    """The code at git ``ref`` under ``where`` (no worktree metadata), sharing data/."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    (where / "data").symlink_to(REPO / "data")
    return where


def _timed(cmd: list[str], tree: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run ``cmd`` in ``tree`` with that tree's ups first on the path; its wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, proc


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _cell(row: dict[str, float], fmt: str = ".2f") -> str:
    return f"{row['median']:{fmt}} ({row['min']:{fmt}}-{row['max']:{fmt}})"


def compare(ref: str, repeat: int) -> dict[str, Any]:
    """``ups-preflight`` at ``ref`` (A) and in this checkout (B), ABAB."""
    py = sys.executable
    full = [py, "-m", "ups.preflight.cli", "--json", "--events", "off", "--config",
            "configs/demo.yaml", "--master-port"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-preflight-") as tmp:
        bad = Path(tmp, "bad.yaml")
        bad.write_text(BAD_CONFIG)
        bad_cmd = [py, "-m", "ups.preflight.cli", "--events", "off", "--config", str(bad)]
        trees = {"before": _source_tree(ref, Path(tmp, "before")), "after": REPO}
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        codes: dict[str, set[int]] = {name: set() for name in trees}
        for _ in range(repeat):
            for name, tree in trees.items():  # ABAB: load drifts hit both alike
                got = samples[name]
                # A free port each time: other jobs on a shared machine take ports too.
                wall, proc = _timed([*full, str(pick_free_port(0))], tree)
                report = json.loads(proc.stdout)
                if not report["ok"]:
                    failed = [c for c in report["checks"] if c["status"] == "fail"]
                    raise SystemExit(f"{name}: preflight failed: {jsonio.dumps(failed)[:3000]}")
                checks = {c["name"]: c["duration_s"] for c in report["checks"]}
                got.setdefault("command_s", []).append(wall)
                got.setdefault("in_process_s", []).append(report["duration_s"])
                got.setdefault("disk_s", []).append(checks["disk"])
                got.setdefault("allreduce_s", []).append(checks["allreduce"])
                wall, proc = _timed(bad_cmd, tree)
                got.setdefault("bad_config_s", []).append(wall)
                codes[name].add(proc.returncode)
        ups = [py, "-c", "import sys; from ups.cli import main; sys.exit(main())"]
        launch = [_timed([*ups, "launch", str(bad)], REPO) for _ in range(repeat)]
    return {
        "ref": ref,
        "repeat": repeat,
        **{name: {k: _spread(v) for k, v in got.items()} for name, got in samples.items()},
        "bad_config_exit_codes": {name: sorted(c) for name, c in codes.items()},
        "launch_bad_config_s": _spread([wall for wall, _ in launch]),
        "launch_bad_config_exit_codes": sorted({proc.returncode for _, proc in launch}),
    }


def print_compare(result: dict[str, Any]) -> None:
    rows = [
        ("command_s", "`ups-preflight --config configs/demo.yaml` (all checks), s"),
        ("in_process_s", "  of it, the checks (report duration_s), s"),
        ("disk_s", "  disk check, s"),
        ("allreduce_s", "  allreduce check, s"),
        ("bad_config_s", "bad config: `ups-preflight --config bad.yaml`, s"),
    ]
    print(f"before = {result['ref']}, after = this checkout; median of {result['repeat']} "
          "(min-max), ABAB\n")  # fmt: skip
    print(f"| {'what':<62} | {'before':<20} | {'after':<20} |")
    print(f"|{'-' * 64}|{'-' * 22}|{'-' * 22}|")
    for key, label in rows:
        print(f"| {label:<62} | {_cell(result['before'][key]):<20} "
              f"| {_cell(result['after'][key]):<20} |")  # fmt: skip
    codes = result["bad_config_exit_codes"]
    print(f"\nbad config exit codes: before {codes['before']}, after {codes['after']}; "
          f"`ups launch bad.yaml`: {_cell(result['launch_bad_config_s'])} s, "
          f"exit {result['launch_bad_config_exit_codes']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--iters", type=int, default=ITERS, help="timed iterations, both sides")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--compare", metavar="REF", help="before (git REF) vs after, ABAB")
    args = p.parse_args(argv)
    if args.compare:
        result = compare(args.compare, args.repeat)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"ups-preflight on {platform.node()} ({os.cpu_count()} CPUs, torch "
              f"{torch.__version__}), load average after the run {load}")  # fmt: skip
        print_compare(result)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(jsonio.dumps({"host": platform.node(), "cpus": os.cpu_count(),
                                               "torch": torch.__version__, "load_average": load,
                                               **result}, indent=2))  # fmt: skip
        return 0
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
