"""CPU of ``ups launch``'s two samplers of the ranks' processes: separate walks vs one.

While torchrun runs, launch samples the ranks' processes from two threads: the RSS
sampler (every 0.5 s) and, for a ``--script`` run, the stall watch (every second). Each
used to find the ranks by walking the whole process table itself, the RSS sampler at
every sample; now one ``RankProcesses`` walks it for both, every 5 s (sooner when a rank
process has gone). Both arrangements run here, in this process, against one real 2-rank
torchrun (each rank with a child, as a DataLoader worker would be), alternating ABBA for
``--seconds`` each; the samplers' calls are made at their threads' cadence and their CPU
time (``time.thread_time``) summed. Reports CPU milliseconds per second of run, each
arrangement's table walks, and the ratio.

    .venv/bin/python benchmarks/bench_samplers.py [--seconds 30] [--repeats 2] \\
        [--json benchmarks/results/samplers_cpu.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from ups import jsonio
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.procs import RankProcesses, RssSampler, become_subreaper
from ups.launch.ranklogs import RankLogs
from ups.launch.stall import StallWatch, rescan_interval
from ups.launch.stallrule import StallRule

RANK = """
import subprocess, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
time.sleep(float(sys.argv[1]))
child.kill()
dist.destroy_process_group()
"""


def _arrangement(shared: bool, plan: Any, work: Path) -> tuple[RssSampler, StallWatch, list]:
    """Before: the RSS sampler walks at every sample, the stall watch on its own. Now: one
    ``RankProcesses`` for both."""
    logs = RankLogs(work / "none", plan.nproc_per_node, lambda _: None)
    if shared:
        ranks = RankProcesses(rescan_interval(plan.stall_timeout_s))
        return RssSampler(ranks), StallWatch(plan, logs, ranks), [ranks]
    rss_ranks, watch_ranks = (
        RankProcesses(rescan_s=0.0),
        RankProcesses(rescan_interval(plan.stall_timeout_s)),
    )
    return RssSampler(rss_ranks), StallWatch(plan, logs, watch_ranks), [rss_ranks, watch_ranks]


def measure(shared: bool, seconds: float, plan: Any, rule: StallRule, work: Path) -> dict:
    sampler, watch, walkers = _arrangement(shared, plan, work)
    cpu, started, next_watch = 0.0, time.monotonic(), 0.0
    tick = 0
    while (now := time.monotonic()) - started < seconds:
        before = time.thread_time()
        sampler.sample()
        if now >= next_watch:
            watch.poll(rule, now)
            next_watch = now + 1.0
        cpu += time.thread_time() - before
        tick += 1
        time.sleep(max(0.0, started + tick * sampler.interval_s - time.monotonic()))
    elapsed = time.monotonic() - started
    return {
        "cpu_ms_per_s": round(1000 * cpu / elapsed, 3),
        "walks": sum(w.walks for w in walkers),
        "ranks_seen": sorted(sampler.peak_rss),
        "seconds": round(elapsed, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="per arrangement and repeat")
    ap.add_argument("--repeats", type=int, default=2, help="ABBA pairs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    become_subreaper()  # as launch is: the ranks' children stay in the tree it walks
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[dict]] = {"separate": [], "shared": []}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-samplers-") as tmp:
        work = Path(tmp)
        script = work / "rank.py"
        script.write_text(RANK)
        req = LaunchRequest(script=str(script), output_dir=str(work / "runs"), run_id="cpu")
        plan = build_plan(req, None, gpu_count=0, pick_port=lambda port: port, environ=env)
        rule = StallRule(plan.stall_timeout_s or 300.0, single_node=True, cwd=work)
        total = 2 * args.repeats * args.seconds + 60
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", str(script), str(total)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(20)  # the ranks import torch, join and start their children
            for n in range(args.repeats):
                order = (False, True) if n % 2 == 0 else (True, False)  # ABBA
                for shared in order:
                    row = measure(shared, args.seconds, plan, rule, work)
                    runs["shared" if shared else "separate"].append(row)
                    print("shared" if shared else "separate", row, flush=True)
        finally:
            agent.terminate()
            agent.wait(timeout=60)
    med = {k: statistics.median(r["cpu_ms_per_s"] for r in v) for k, v in runs.items()}
    summary = {
        k: f"{med[k]:.3f} ms/s ({min(r['cpu_ms_per_s'] for r in v):.3f}.."
        f"{max(r['cpu_ms_per_s'] for r in v):.3f}), walks {[r['walks'] for r in v]}"
        for k, v in runs.items()
    }
    summary["ratio_shared_to_separate"] = round(med["shared"] / med["separate"], 3)
    result = {
        "command": " ".join(["benchmarks/bench_samplers.py", *sys.argv[1:]]),
        "processes_on_machine": len(psutil.pids()),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
        "summary": summary,
    }
    print(jsonio.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(jsonio.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
