"""Trainer throughput on CPU: 1 process vs 2 torchrun ranks, loader vs step, peak memory.

Run from the repository root::

    .venv/bin/python benchmarks/bench_train.py            # configs/demo.yaml, 100 steps
    .venv/bin/python benchmarks/bench_train.py --steps 60 --repeats 1
    .venv/bin/python benchmarks/bench_train.py --agreement --steps 60 --repeats 3

In one run it measures, side by side:

1. end-to-end training with the real trainer (``ups.train.main``): one process with one
   thread, one process with two threads, two torchrun ranks (gloo) with one thread each.
   Throughput is the steady state from the per-step events in ``logs/rank<N>.jsonl``
   (the first ``--warmup`` steps are left out), counting the exact samples each rank logged
   (``training.record_sample_ids``). Each worker runs under this script's ``--worker`` mode,
   which calls the trainer's ``main`` and then records its own peak RSS (VmHWM);
2. in one process (one thread): the multi-task loader alone (``next()`` on the
   MultiTaskLoader, no model) vs the training step alone (``Trainer.train_step`` on the
   same batches, held in memory), to see whether the loader is ever the bottleneck.

``--agreement`` measures instead the per-step cost of the per-step agreement against the
step it replaced, side by side in the same ranks (``benchmarks/agreement_cost.py``);
results go to ``benchmarks/results/train-agreement-cpu.txt`` unless ``--out`` says.

Results go to stdout and ``--out`` (default ``benchmarks/results/train-cpu.txt``).
W&B is disabled in these runs: it is not what is being measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups import jsonio

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()


def _vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(argv: list[str]) -> int:
    """``--worker OUTDIR CONFIG [--set ...]``: run one trainer worker, then record its peak RSS."""
    out, trainer_args = Path(argv[0]), argv[1:]
    from ups.train.main import main

    rc = int(main(trainer_args) or 0)
    rank = os.environ.get("RANK", "0")
    record = {"rank": int(rank), "rc": rc, "vm_hwm_kib": _vm_hwm_kib()}
    (out / f"peak_rank{rank}.json").write_text(jsonio.dumps(record))
    return rc


# End-to-end runs


@dataclass
class E2E:
    name: str
    ranks: int
    threads: int
    samples_per_s: float
    step_ms: float
    wall_s: float
    peak_mib: list[float]


def _child_env(threads: int) -> dict[str, str]:
    drop = ("WANDB_", "UPS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": str(threads), "WANDB_MODE": "disabled"})
    return env


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def run_training(
    name: str,
    config: Path,
    data_overrides: list[str],
    *,
    ranks: int,
    threads: int,
    steps: int,
    warmup: int,
    work: Path,
) -> E2E:
    out = work / name.replace(" ", "-").replace(",", "")
    out.mkdir(parents=True)
    overrides = [
        f"run.output_dir={out / 'runs'}",
        "run.run_id=bench",
        f"training.max_steps={steps}",
        "training.log_every=1",
        "training.record_sample_ids=true",
        "wandb.mode=disabled",
        "checkpoint.every_steps=1000000",
        "distributed.backend=gloo",
        *data_overrides,
    ]
    args = [str(SCRIPT), "--worker", str(out), str(config)]
    args += [a for o in overrides for a in ("--set", o)]
    if ranks > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        args = [*launcher, "--monitor-interval=0.2", *args]
    started = time.monotonic()
    with (out / "stdout.txt").open("w") as sink:
        proc = subprocess.run(
            [sys.executable, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=_child_env(threads),
            cwd=REPO,
            timeout=600,
        )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        tail = (out / "stdout.txt").read_text()[-3000:]
        raise SystemExit(f"{name}: trainer exited {proc.returncode}\n{tail}")
    logs = out / "runs" / "bench" / "logs"
    per_step = {s: 0 for s in range(steps)}
    for rank in range(ranks):
        for e in _events(logs / f"rank{rank}.jsonl"):
            if e.get("event") == "batch_ids":
                per_step[e["step"]] += sum(len(ids) for ids in e["ids"].values())
    done = {e["step"]: _ts(e) for e in _events(logs / "rank0.jsonl") if e["event"] == "train_step"}
    first, last = warmup - 1, steps - 1
    seconds = done[last] - done[first]
    samples = sum(per_step[s] for s in range(first + 1, last + 1))
    peaks = [json.loads((out / f"peak_rank{r}.json").read_text()) for r in range(ranks)]
    return E2E(
        name=name,
        ranks=ranks,
        threads=threads,
        samples_per_s=samples / seconds,
        step_ms=1000 * seconds / (last - first),
        wall_s=wall,
        peak_mib=[p["vm_hwm_kib"] / 1024 for p in sorted(peaks, key=lambda p: p["rank"])],
    )


# Loader alone vs step alone (in this process)


@dataclass
class Split:
    first_ms: float
    """The first call (the loader reads each split into memory there)."""
    ms: list[float]
    samples: int

    def stat(self, q: float) -> float:
        return statistics.quantiles(self.ms, n=100, method="inclusive")[int(q * 100) - 1]


def _batches(loader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def loader_vs_step(
    config: Path, data_overrides: list[str], steps: int, warmup: int, work: Path
) -> tuple[Split, Split, int]:
    import torch

    from ups.config import load_config
    from ups.data.loader import build_loader
    from ups.data.pdebench import inspect_task
    from ups.distributed.env import read_dist_env
    from ups.distributed.process_group import init_distributed, shutdown_distributed
    from ups.log import setup_logging
    from ups.train.run import build_trainer
    from ups.train.signals import StopFlag
    from ups.train.tracking import Tracker

    torch.set_num_threads(1)
    setup_logging(stdout=open(os.devnull, "w"))  # noqa: SIM115  # lives as long as the process
    cfg = load_config(config, ["wandb.mode=disabled", "distributed.backend=gloo", *data_overrides])
    infos = {task.name: inspect_task(task) for task in cfg.tasks}
    kwargs = {"batch_size": cfg.training.batch_size, "num_workers": cfg.training.num_workers}
    loader = build_loader(list(cfg.tasks), infos, rank=0, world_size=1, seed=0, **kwargs)  # type: ignore[arg-type]  # dict[str, int]

    it, batches, times = _batches(loader), [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        batches.append(next(it))
        times.append(1000 * (time.perf_counter() - t0))
    counts = [sum(len(x) for x, _, _ in b.values()) for b in batches]
    load = Split(times[0], times[warmup:], sum(counts[warmup:]))

    env = read_dist_env({})
    device = init_distributed(env, cfg.distributed)
    torch.manual_seed(0)
    trainer = build_trainer(
        cfg,
        env,
        infos,
        device,
        loader=loader,
        tracker=Tracker(),
        stop=StopFlag(),
        checkpoint_dir=work / "unused-checkpoints",
    )
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        trainer.train_step(batch, epoch=0)
        times.append(1000 * (time.perf_counter() - t0))
    shutdown_distributed()
    step = Split(times[0], times[warmup:], sum(counts[warmup:]))
    return load, step, loader.steps_per_epoch


def snapshot_data(config: Path, into: Path) -> list[str]:
    """Copy the config's data files into ``into`` (or synthesize the demo there when they are
    missing) and return the ``--set tasks.N.path=...`` overrides pointing at the copies, so
    a rewrite of the shared ``data/demo`` during the benchmark cannot change what is measured.
    """
    from ups.config import load_config
    from ups.data.synth import synthesize

    cfg = load_config(config, check_files=False)
    into.mkdir(parents=True)
    if all(Path(t.path).is_file() for t in cfg.tasks):
        for task in cfg.tasks:
            shutil.copy2(task.path, into / Path(task.path).name)
    else:
        print(f"data missing: writing the demo files with `ups data synth` (seed 0) into {into}")
        synthesize(into, 0)
    return [f"tasks.{i}.path={into / Path(t.path).name}" for i, t in enumerate(cfg.tasks)]


# Report


def _report(
    args: argparse.Namespace, tries: dict[str, list[E2E]], load: Split, step: Split, spe: int
) -> str:
    import torch

    runs = [max(t, key=lambda r: r.samples_per_s) for t in tries.values()]
    base = runs[0].samples_per_s
    lines = [
        f"ups trainer benchmark, CPU/gloo - {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"config {args.config}, {args.steps} steps per run ({args.warmup} warm-up steps left "
        f"out), best of {args.repeats}; torch {torch.__version__}, python "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores shared with other jobs "
        f"(load average at start {args.load_at_start})",
        "",
        "1. End-to-end training (ups.train.main), steady-state throughput",
        f"{'run':<24}{'ranks':>6}{'thr/rank':>9}{'samples/s':>11}{'vs 1p1t':>9}"
        f"{'ms/step':>9}{'wall s':>8}  {'peak RSS/rank MiB':<19}samples/s of every try",
    ]
    for r in runs:
        peaks = ", ".join(f"{p:.0f}" for p in r.peak_mib)
        every = ", ".join(f"{t.samples_per_s:.0f}" for t in tries[r.name])
        lines.append(
            f"{r.name:<24}{r.ranks:>6}{r.threads:>9}{r.samples_per_s:>11.0f}"
            f"{r.samples_per_s / base:>8.2f}x{r.step_ms:>9.1f}{r.wall_s:>8.1f}  {peaks:<19}{every}"
        )
    lines += [
        "each row is the setting's best try (the one least slowed by other jobs on the cores);",
        "samples/s counts every rank's samples (a step = one batch of each task per rank);",
        "ms/step is the time between rank 0's step events (data loading included);",
        "wall s includes interpreter start, data checks, eval and the final checkpoint.",
        "",
        f"2. Loader alone vs training step alone (one process, one thread, world 1, "
        f"{len(load.ms)} steps after {args.warmup} warm-up, {spe} steps per epoch)",
        f"{'':<22}{'mean ms':>9}{'p50':>8}{'p95':>8}{'max':>8}{'samples/s':>11}{'first ms':>10}",
    ]
    for name, s in (("loader alone", load), ("train step alone", step)):
        mean = statistics.fmean(s.ms)
        lines.append(
            f"{name:<22}{mean:>9.2f}{s.stat(0.5):>8.2f}{s.stat(0.95):>8.2f}{max(s.ms):>8.2f}"
            f"{1000 * s.samples / sum(s.ms):>11.0f}{s.first_ms:>10.1f}"
        )
    ratio = statistics.fmean(load.ms) / statistics.fmean(step.ms)
    slower = sum(a > b for a, b in zip(load.ms, step.ms, strict=True))
    lines += [
        f"loader / step time: mean {ratio:.3f}x, worst loader step / median train step "
        f"{max(load.ms) / step.stat(0.5):.3f}x; loader slower than its step in "
        f"{slower} of {len(load.ms)} steps",
        f"with num_workers=0 the loader runs in line with the step: it is "
        f"{100 * ratio / (1 + ratio):.1f}% of each step's time",
    ]
    return "\n".join(lines) + "\n"


def _agreement(args: argparse.Namespace) -> int:
    import agreement_cost  # beside this script (sys.path[0])
    import torch

    out = args.out or Path("benchmarks/results/train-agreement-cpu.txt")
    with tempfile.TemporaryDirectory(prefix="ups-bench-") as tmp:
        data_overrides = snapshot_data(args.config, Path(tmp) / "data")
        lines = agreement_cost.run(
            SCRIPT,
            args.config,
            data_overrides,
            steps=args.steps,
            warmup=args.warmup,
            repeats=args.repeats,
            work=Path(tmp),
        )
    header = [
        f"ups agreement benchmark, CPU/gloo - {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"config {args.config}; torch {torch.__version__}, python {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores shared with other jobs (load average at start "
        f"{args.load_at_start})",
        "",
    ]
    report = "\n".join(header + lines) + "\n"
    print(report, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--agreement-worker":
        import agreement_cost  # beside this script (sys.path[0])

        out, config, steps, warmup, *sets = sys.argv[2:]
        agreement_cost.worker(Path(out), Path(config), sets, int(steps), int(warmup))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--steps", type=int, default=100, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting; best kept")
    parser.add_argument("--out", type=Path, default=None, help="report file")
    parser.add_argument(
        "--agreement", action="store_true", help="only the agreement's per-step cost"
    )
    args = parser.parse_args()
    args.load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.agreement:
        return _agreement(args)
    args.out = args.out or Path("benchmarks/results/train-cpu.txt")

    settings = [("1 process, 1 thread", 1, 1), ("1 process, 2 threads", 1, 2)]
    settings.append(("torchrun, 2 ranks", 2, 1))
    tries: dict[str, list[E2E]] = {name: [] for name, _, _ in settings}
    with tempfile.TemporaryDirectory(prefix="ups-bench-") as tmp:
        data_overrides = snapshot_data(args.config, Path(tmp) / "data")
        # Settings take turns, so a burst of load from other jobs hits each of them alike.
        for i in range(args.repeats):
            for name, ranks, threads in settings:
                print(f"running: {name} (try {i + 1}/{args.repeats})", flush=True)
                tries[name].append(
                    run_training(
                        name,
                        args.config,
                        data_overrides,
                        ranks=ranks,
                        threads=threads,
                        steps=args.steps,
                        warmup=args.warmup,
                        work=Path(tmp) / f"try{i}",
                    )
                )
        print("running: loader alone vs step alone", flush=True)
        load, step, spe = loader_vs_step(
            args.config, data_overrides, args.steps, args.warmup, Path(tmp)
        )
    report = _report(args, tries, load, step, spe)
    print(report, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
