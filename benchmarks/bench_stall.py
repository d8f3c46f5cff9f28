"""What stall detection costs and how fast it ends a hung script (``ups launch --stall-timeout``).

Two measurements, 2 gloo ranks on this machine:

- ``exit``: the issue's hang (rank 1 asleep outside any collective, rank 0 waiting in an
  all-reduce). Rank 1 writes the wall time as it falls asleep; the seconds from then to
  ``ups launch``'s exit, for each timeout (goal: the timeout + 15 s at most), and to the
  ``stall_detected`` line.
- ``cost``: a training-like loop (a matmul and an all-reduce per step), the ranks timing
  their own steps; ``--stall-timeout 0`` (no watcher, no hook) and the default (watched)
  alternate ABBA (a load that drifts during the run favours neither), ``--repeats``
  pairs. Each run's median step time; the ratio of medians,
  each pair's ratio and the spread. Also the CPU seconds of ``ups launch``'s own process
  per second of run (the watcher's thread is in it).
- ``watch``: the CPU milliseconds of one poll of the watcher (it polls once a second), in
  this process against a real 2-rank torchrun: the watcher's whole cost is that share of
  a core, taken from the host's spare CPU (the ranks never run any of it).

    .venv/bin/python benchmarks/bench_stall.py [--timeouts 10 30] [--repeats 3] \\
        [--steps 1000] [--json benchmarks/results/stall_cpu.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from ups import jsonio
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.ranklogs import RankLogs
from ups.launch.stall import StallWatch
from ups.launch.stallrule import StallRule

UPS = [sys.executable, "-m", "ups", "launch", "--skip-preflight"]

HANG = """
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    with open(os.environ["HANG_FILE"], "w") as f:
        f.write(repr(time.time()))
    time.sleep(3600)
dist.all_reduce(t)
"""

STEPS = """
import json, statistics, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
a = torch.randn(384, 384)
grad = torch.randn(64 * 1024)
times = []
for step in range(int(sys.argv[1])):
    start = time.perf_counter()
    for _ in range(4):
        b = a @ a
    dist.all_reduce(grad)
    times.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    print(json.dumps({"step_ms": 1000 * statistics.median(times[50:])}), flush=True)
dist.destroy_process_group()  # without it gloo's threads can abort the exit (SIGABRT)
"""


def _launch(args: list[str], env: dict[str, str], out: Path) -> tuple[int, float, str]:
    """Run ``ups launch ARGS``; its exit code, its own CPU seconds, its stdout."""
    with out.open("w") as sink:
        proc = subprocess.Popen([*UPS, *args], stdout=sink, stderr=subprocess.STDOUT, env=env)
        me = psutil.Process(proc.pid)
        cpu = [0.0]

        def watch() -> None:  # launch's own CPU (not its children's), until it exits
            while proc.poll() is None:
                try:
                    t = me.cpu_times()
                    cpu[0] = t.user + t.system
                except psutil.Error:
                    return
                time.sleep(0.2)

        poller = threading.Thread(target=watch, daemon=True)
        poller.start()
        rc = proc.wait(timeout=900)
        poller.join()
    return rc, cpu[0], out.read_text()


def _events(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            found.append(event)
    return found


def _stamp(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["timestamp"]).timestamp()


def measure_exit(work: Path, timeout_s: float, env: dict[str, str]) -> dict[str, float]:
    script = work / "hang.py"
    script.write_text(HANG)
    hang_file = work / f"hang-{timeout_s:g}"
    hang_file.unlink(missing_ok=True)
    args = ["--script", str(script), "--output-dir", str(work / "runs"), "--fresh",
            "--stall-timeout", f"{timeout_s:g}"]  # fmt: skip
    log = work / f"exit-{timeout_s:g}-{time.time():.0f}.log"
    rc, _, text = _launch(args, {**env, "HANG_FILE": str(hang_file)}, log)
    ended = time.time()
    assert rc == 124, text[-3000:]
    began = float(hang_file.read_text())
    events = _events(text)
    detected = next(e for e in events if e["event"] == "stall_detected")
    ended_line = next(e for e in events if e["event"] == "run_ended")
    stacks = Path(detected["stacks"]) / "rank1.txt"
    asked = [
        round(dt.datetime.fromisoformat(m.split(" at ")[1].split(": ")[0]).timestamp() - began, 2)
        for m in stacks.read_text().splitlines()
        if m.startswith("--- ups launch")
    ]
    return {
        "timeout_s": timeout_s,
        "to_exit_s": round(ended - began, 2),
        "to_detected_s": round(_stamp(detected) - began, 2),
        "to_run_ended_s": round(_stamp(ended_line) - began, 2),
        "stacks_asked_at_s": asked,
        "ruled_out": sum(e["event"] == "stall_ruled_out" for e in events),
        "over_timeout_s": round(ended - began - timeout_s, 2),
        "log": str(log),
    }


def measure_cost(work: Path, steps: int, watched: bool, env: dict[str, str]) -> dict[str, float]:
    script = work / "steps.py"
    script.write_text(STEPS)
    args = ["--script", str(script), "--output-dir", str(work / "runs"), "--fresh"]
    if not watched:
        args += ["--stall-timeout", "0"]
    started = time.monotonic()
    rc, cpu, text = _launch([*args, "--", str(steps)], env, work / "cost.log")
    wall = time.monotonic() - started
    assert rc == 0, text[-3000:]
    step_ms = next(json.loads(line)["step_ms"] for line in text.splitlines() if "step_ms" in line)
    return {"step_ms": round(step_ms, 4), "launch_cpu_s": round(cpu, 3), "wall_s": round(wall, 2)}


def measure_watch_cpu(work: Path, polls: int, env: dict[str, str]) -> dict[str, float]:
    """CPU milliseconds of one poll of the watcher (sample every rank's processes, the
    rule), taken in this process against a real 2-rank torchrun run of the step loop."""
    script = work / "steps.py"
    script.write_text(STEPS)
    req = LaunchRequest(script=str(script), output_dir=str(work / "runs"), run_id="cpu")
    plan = build_plan(req, None, gpu_count=0, pick_port=lambda port: port, environ=env)
    watch = StallWatch(plan, RankLogs(work / "none", plan.nproc_per_node, lambda _: None))
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), "100000"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        rule = StallRule(plan.stall_timeout_s or 300.0, single_node=True, cwd=work)
        time.sleep(15)  # the ranks import torch and start stepping
        costs = []
        for _ in range(polls):
            before = time.thread_time()
            watch.poll(rule, time.monotonic())
            costs.append(1000 * (time.thread_time() - before))
            time.sleep(1.0)  # the watcher's cadence, so full walks come every 5th poll
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    procs = len(psutil.pids())
    return {
        "poll_cpu_ms_median": round(statistics.median(costs), 3),
        "poll_cpu_ms_mean": round(statistics.mean(costs), 3),
        "poll_cpu_ms_max": round(max(costs), 3),
        "polls": polls,
        "processes_on_machine": procs,
        "core_share": round(statistics.mean(costs) / 1000, 5),
    }


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--timeouts", type=float, nargs="*", default=[10.0, 30.0])
    ap.add_argument("--exit-repeats", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="ABAB pairs for the cost")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--work", type=Path, help="keep the runs and logs here (default: a temp dir)")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--watch-polls", type=int, default=60, help="0: skip the poll CPU")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        exits = []
        for timeout_s in args.timeouts:
            for _ in range(args.exit_repeats):
                exits.append(measure_exit(work, timeout_s, env))
                print("exit", exits[-1], flush=True)
        results["exit"] = exits
        if args.watch_polls:
            results["watch_cpu"] = measure_watch_cpu(work, args.watch_polls, env)
            print("watch", results["watch_cpu"], flush=True)
        pairs = []
        for n in range(0 if args.skip_cost else args.repeats):
            # ABBA: a load that drifts during the run favours neither side.
            if n % 2 == 0:
                off = measure_cost(work, args.steps, watched=False, env=env)
                on = measure_cost(work, args.steps, watched=True, env=env)
            else:
                on = measure_cost(work, args.steps, watched=True, env=env)
                off = measure_cost(work, args.steps, watched=False, env=env)
            pairs.append({"off": off, "on": on, "ratio": round(on["step_ms"] / off["step_ms"], 4)})
            print("cost", pairs[-1], flush=True)
        results["cost"] = pairs
    summary: dict[str, Any] = {}
    if exits:
        summary["over_timeout_s"] = _spread([e["over_timeout_s"] for e in exits])
    if "watch_cpu" in results:
        summary["watch_core_share"] = results["watch_cpu"]["core_share"]
    if pairs:
        off_ms = [p["off"]["step_ms"] for p in pairs]
        on_ms = [p["on"]["step_ms"] for p in pairs]
        summary |= {
            "step_ms_off": _spread(off_ms),
            "step_ms_on": _spread(on_ms),
            "ratio_of_medians": round(statistics.median(on_ms) / statistics.median(off_ms), 4),
            "pair_ratios": [p["ratio"] for p in pairs],
            "launch_cpu_per_s_off": _spread(
                [p["off"]["launch_cpu_s"] / p["off"]["wall_s"] for p in pairs]
            ),
            "launch_cpu_per_s_on": _spread(
                [p["on"]["launch_cpu_s"] / p["on"]["wall_s"] for p in pairs]
            ),
        }
    results["summary"] = summary
    results["load_after"] = os.getloadavg()
    print(jsonio.dumps(results["summary"], indent=2))
    if args.json:
        args.json.write_text(jsonio.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
