"""DataLoader workers: ``training.num_workers`` 0 vs 2, samples/s and memory per rank.

Run from the repository root::

    .venv/bin/python benchmarks/bench_loader.py                 # configs/demo.yaml, 3 x ABAB
    .venv/bin/python benchmarks/bench_loader.py --steps 40 --repeats 2

Two torchrun ranks (gloo) train the demo with the real trainer; the runs alternate
(0, 2, 0, 2, ...) so drifting load on a shared machine hits both settings alike.
Throughput is the steady state from rank 0's ``train_step`` events (log_every=1; the
first ``--warmup`` steps, which include starting and warming the workers, are left out),
which includes any time the rank waited for a batch. While a run trains, a sampler reads
every rank's process and its DataLoader workers every 0.25 s: the peak RSS of the rank
itself, and the peak of rank + workers counted as PSS (shared pages split between the
processes that map them, so what the workers share with their rank is not counted twice)
and as plain RSS (counted twice). Results: stdout and ``--out``
(default ``benchmarks/results/loader-cpu.json``). W&B is disabled: it is not measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import _child_env, _events, _ts, snapshot_data  # sibling script

from ups import jsonio  # after the sibling import path

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


class Sampler(threading.Thread):
    """Peak memory per rank (``RANK`` in the environment), rank alone and with workers."""

    def __init__(self, root: int, cache_dir: str | None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.cache_dir = cache_dir
        self.cache_rank: dict[int, int] = {}
        """Peak RSS of the latent cache's mapped files in the rank itself."""
        self.cache_workers: dict[int, int] = {}
        """Peak RSS of those files in any one of the rank's workers."""
        self.stop = threading.Event()
        self.rank_rss: dict[int, int] = {}
        self.total_pss: dict[int, int] = {}
        self.total_rss: dict[int, int] = {}
        self.workers: dict[int, int] = {}

    def _ranks(self) -> dict[int, psutil.Process]:
        found = {}
        for p in psutil.Process(self.root).children(recursive=True):
            try:
                rank = p.environ().get("RANK")
                if rank is not None and p.parent().environ().get("RANK") is None:
                    found[int(rank)] = p
            except psutil.Error:
                continue
        return found

    def sample(self) -> None:
        for rank, proc in self._ranks().items():
            try:
                procs = [proc, *proc.children(recursive=True)]
                mems = [p.memory_full_info() for p in procs]
            except psutil.Error:
                continue
            self.rank_rss[rank] = max(self.rank_rss.get(rank, 0), mems[0].rss)
            self.total_pss[rank] = max(self.total_pss.get(rank, 0), sum(m.pss for m in mems))
            self.total_rss[rank] = max(self.total_rss.get(rank, 0), sum(m.rss for m in mems))
            self.workers[rank] = max(self.workers.get(rank, 0), len(procs) - 1)
            if self.cache_dir is not None:
                cached = [self._cache_rss(p) for p in procs]
                self.cache_rank[rank] = max(self.cache_rank.get(rank, 0), cached[0])
                self.cache_workers[rank] = max(self.cache_workers.get(rank, 0), *cached[1:], 0)

    def _cache_rss(self, proc: psutil.Process) -> int:
        assert self.cache_dir is not None
        try:
            maps = proc.memory_maps(grouped=True)
        except psutil.Error:
            return 0
        return sum(m.rss for m in maps if m.path.startswith(self.cache_dir))

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.sample()


def run_once(
    config: Path,
    overrides: list[str],
    workers: int,
    steps: int,
    warmup: int,
    out: Path,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True)
    sets = [
        f"run.output_dir={out / 'runs'}",
        "run.run_id=bench",
        f"training.max_steps={steps}",
        f"training.num_workers={workers}",
        "training.log_every=1",
        "training.record_sample_ids=true",
        "wandb.mode=disabled",
        "checkpoint.every_steps=1000000",
        "distributed.backend=gloo",
        *overrides,
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["--monitor-interval=0.2", "-m", "ups.train.main", str(config)]
    cmd += [a for s in sets for a in ("--set", s)]
    with (out / "stdout.txt").open("w") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=_child_env(1), cwd=REPO
        )
        sampler = Sampler(proc.pid, str(cache_dir) if cache_dir else None)
        sampler.start()
        rc = proc.wait(timeout=900)
        sampler.stop.set()
        sampler.join()
    if rc != 0:
        raise SystemExit(
            f"num_workers={workers}: exited {rc}\n{(out / 'stdout.txt').read_text()[-3000:]}"
        )
    logs = out / "runs" / "bench" / "logs"
    done = {e["step"]: _ts(e) for e in _events(logs / "rank0.jsonl") if e["event"] == "train_step"}
    samples = 0  # exactly what both ranks trained on after the warm-up (record_sample_ids)
    for rank in (0, 1):
        for e in _events(logs / f"rank{rank}.jsonl"):
            if e["event"] == "batch_ids" and e["step"] >= warmup:
                samples += sum(len(ids) for ids in e["ids"].values())
    seconds = done[steps - 1] - done[warmup - 1]
    return {
        "num_workers": workers,
        "samples_per_s": samples / seconds,
        "rank_rss_mib": [sampler.rank_rss[r] / MIB for r in sorted(sampler.rank_rss)],
        "rank_plus_workers_pss_mib": [
            sampler.total_pss[r] / MIB for r in sorted(sampler.total_pss)
        ],
        "rank_plus_workers_rss_mib": [
            sampler.total_rss[r] / MIB for r in sorted(sampler.total_rss)
        ],
        "workers_seen": [sampler.workers[r] for r in sorted(sampler.workers)],
        **(
            {
                "cache_rss_in_rank_mib": [sampler.cache_rank[r] / MIB for r in (0, 1)],
                "cache_rss_in_a_worker_mib": [sampler.cache_workers[r] / MIB for r in (0, 1)],
            }
            if cache_dir
            else {}
        ),
    }


def build_cache(config: Path, overrides: list[str], into: Path) -> list[str]:
    """``ups cache build`` (fresh encoders: what is measured is memory, not accuracy)."""
    sets = [*overrides, f"cache.dir={into}", f"run.output_dir={into.parent / 'no-runs'}"]
    cmd = [sys.executable, "-m", "ups", "cache", "build", str(config)]
    subprocess.run(
        [*cmd, *(a for s in sets for a in ("--set", s))], check=True, cwd=REPO, env=_child_env(1)
    )
    return [f"cache.dir={into}", "cache.enabled=true"]


def _summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [max(r[key]) if isinstance(r[key], list) else r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/loader-cpu.json")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="train on a latent cache (built first) and record its mapped pages per process",
    )
    args = parser.parse_args()
    runs: dict[int, list[dict[str, Any]]] = {0: [], 2: []}
    load = []
    with tempfile.TemporaryDirectory() as tmp:
        overrides = snapshot_data(args.config, Path(tmp) / "data")
        cache_dir = Path(tmp) / "cache" if args.cache else None
        if cache_dir is not None:
            overrides += build_cache(args.config, overrides, cache_dir)
        for i in range(args.repeats):
            for workers in (0, 2):  # ABAB
                load.append(os.getloadavg()[0])
                out = Path(tmp) / f"r{i}-w{workers}"
                result = run_once(
                    args.config, overrides, workers, args.steps, args.warmup, out, cache_dir
                )
                runs[workers].append(result)
                print(jsonio.dumps(result), flush=True)
    summary = {
        str(w): {
            k: _summary(rs, k)
            for k in ("samples_per_s", "rank_rss_mib", "rank_plus_workers_pss_mib")
        }
        for w, rs in runs.items()
    }
    ratio = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(runs[0], runs[2], strict=True)]
    report = {
        "command": "python benchmarks/bench_loader.py " + " ".join(sys.argv[1:]),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": __import__("torch").__version__,
        "config": str(
            args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
        ),
        "steps": args.steps,
        "latent_cache": args.cache,
        "warmup": args.warmup,
        "load_avg_1m": load,
        "summary": summary,
        "samples_per_s_ratio_2_vs_0": {
            "per_pair": ratio,
            "median": statistics.median(ratio),
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(jsonio.dumps(report, indent=2) + "\n")
    print(jsonio.dumps({"summary": summary, "ratio_median": statistics.median(ratio)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
