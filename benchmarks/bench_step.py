"""ms per training step: the ups step vs a plain DDP step, side by side in the same ranks.

Run from the repository root::

    .venv/bin/python benchmarks/bench_step.py                  # every case, 3 launches each
    .venv/bin/python benchmarks/bench_step.py --steps 15 --repeats 3 --cases ddp:demo:fp32
    python3 benchmarks/bench_step.py --nproc 1 --backend nccl --cases ddp:100m:bf16   # a GPU

For each case (strategy, model size, precision) it launches ``--repeats`` torchrun jobs
(``--nproc`` ranks, default 2 with gloo and one thread each). Every rank builds, from one
seed and the same config,

- **ups skip**: the real trainer (``Trainer.train_step``, ``oom_policy: skip``): local
  backward into the gradient buffer, status exchange, in-place all-reduce, update, second
  status exchange;
- **ups fail**: the real trainer with ``oom_policy: fail``: DDP's overlapped bucketed
  all-reduce, one status exchange;
- **plain**: a plain DDP loop on the same model and batches (forward under the same
  autocast, backward with DDP's all-reduce, clip, AdamW, scheduler; no checks);

holds ``--warmup + --steps`` batches in memory, and runs every variant on each batch in
turn, rotating which goes first (ABC, BCA, CAB, ...), so load from other jobs hits all
alike. It also times the agreement alone (both status exchanges, no step). Reported: the
median ms/step of each variant, samples/s over all ranks, the median of per-batch ratios
ups/plain, and the spread (min-max) of those over the launches. On CUDA every step is
timed to ``torch.cuda.synchronize()``, and then each variant runs alone for
``--util-seconds`` while NVML samples the GPU's utilisation (``gpu util %``). A strategy
is one field of a case: another (e.g. ``fsdp``) is one more entry in :data:`STRATEGIES`
(its config overrides) and, where its plain loop wraps the model differently, one more
branch where the worker builds "plain".

``--compare REF`` runs every try twice, alternating (ABAB): once with the code at git ``REF``
(extracted with ``git archive``, ``data/`` linked in; its own copy of this script runs the
ranks) and once with this checkout; the table then has a "before" and an "after" row per
case, each ratio against the plain step measured in the same launch::

    .venv/bin/python benchmarks/bench_step.py --compare dc36953 --cases ddp:demo:fp32 ddp:12x:fp32

A case that fails (its ranks exit non-zero: a config the trainer refuses, a diverging run)
is marked failed in the table with its reason, and the other cases keep their numbers; the
script then exits 1.

Results: stdout, ``benchmarks/results/step-cpu.txt`` and ``.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
DEMO_CONFIG = REPO / "configs" / "demo.yaml"
sys.path.insert(0, str(REPO))

from ups import jsonio  # noqa: E402  # after the path insert: run as a script

SIZES = {
    "demo": [],  # configs/demo.yaml: latent 64, depth 2 (115k parameters)
    "12x": ["model.latent_dim=192", "model.depth=3"],  # 1.38M parameters
    # 101.0M parameters, at 1/30 of the demo's lr: the point is the step's cost, and at the
    # demo's 3e-3 the bf16 run diverged at step 19 on an H100 (the trainer stops a run with
    # non-finite gradients; benchmarks/results/gpu-suite-h100-2026-11-27-run2.json).
    "100m": ["model.latent_dim=1024", "model.depth=8", "model.heads=8", "training.lr=1e-4"],
    "tiny": ["model.latent_dim=16", "model.depth=1", "model.heads=2"],  # a smoke test's size
}
PRECISIONS = {p: [f"training.precision={p}"] for p in ("fp32", "bf16", "fp16")}
STRATEGIES: dict[str, list[str]] = {"ddp": []}
"""Config overrides per strategy; the variants a worker times come from ``VARIANTS``."""
VARIANTS = ("ups skip", "ups fail", "plain")


def _plain_step(ddp: Any, optimizer: Any, scheduler: Any, cfg: Any, device: Any) -> Callable:
    """A plain DDP training step: what a hand-written loop does, with no guarantees."""
    import torch
    from torch import nn

    from ups.train.amp import autocast
    from ups.train.metrics import rel_l2

    weights = torch.tensor([t.weight for t in cfg.tasks], device=device)

    def step(batch: Any) -> None:
        inputs = {t: x.to(device) for t, (x, _, _) in batch.items()}
        with autocast(cfg.training.precision, device):
            preds = ddp(inputs)
        losses = torch.stack(
            [rel_l2(preds[t].float(), batch[t][1].to(device)).mean() for t in batch]
        )
        ((weights * losses).sum() / weights.sum()).backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), cfg.training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _cycling(step: Callable[[Any], Any], batches: list[Any]) -> Callable[[], None]:
    """``step`` on the held batches in turn, one per call."""
    position = [0]

    def call() -> None:
        step(batches[position[0] % len(batches)])
        position[0] += 1

    return call


def _nvml_utilisation(device_index: int, run: Callable[[], None], seconds: float) -> float | None:
    """Mean GPU utilisation (%) NVML reports while ``run`` is called for ``seconds``."""
    import threading

    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append(pynvml.nvmlDeviceGetUtilizationGPUs(handle).gpu)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        run()
    done.set()
    thread.join()
    pynvml.nvmlShutdown()
    return statistics.fmean(samples) if samples else None


def worker(
    out: Path, config: Path, steps: int, warmup: int, util_s: float, overrides: list[str]
) -> None:
    """One rank: build the three variants, time them on the same batches, write rank0.json."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ups.config import load_config
    from ups.data.loader import build_loader
    from ups.distributed.agreement import Update, agree_local, agree_update
    from ups.distributed.env import read_dist_env
    from ups.distributed.process_group import init_distributed, shutdown_distributed
    from ups.log import setup_logging
    from ups.train.run import build_trainer, make_model
    from ups.train.schedule import lr_schedule
    from ups.train.signals import StopFlag
    from ups.train.startcheck import start_problems
    from ups.train.tracking import Tracker

    env = read_dist_env()
    setup_logging(rank=env.rank, stdout=open(os.devnull, "w"))  # noqa: SIM115  # process-long
    cfg = load_config(config, overrides)
    # What the trainer refuses, this refuses alike.
    infos, problems = start_problems(cfg, cuda=torch.cuda.is_available())
    if problems:
        raise SystemExit("; ".join(problems))
    device = init_distributed(env, cfg.distributed)
    loader = build_loader(list(cfg.tasks), infos, batch_size=cfg.training.batch_size,
                          num_workers=0, rank=env.rank, world_size=env.world_size,
                          seed=0)  # fmt: skip
    loader.set_epoch(0)
    batches = [b for _, b in zip(range(warmup + steps), loader, strict=False)]
    run: dict[str, Callable[[Any], Any]] = {}
    for policy in ("skip", "fail"):
        torch.manual_seed(0)
        variant = load_config(config, [*overrides, f"training.oom_policy={policy}"])
        trainer = build_trainer(variant, env, infos, device, loader=loader, tracker=Tracker(),
                                stop=StopFlag(), checkpoint_dir=out / "unused")  # fmt: skip
        run[f"ups {policy}"] = lambda b, t=trainer: t.train_step(b, epoch=0)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(make_model(cfg, infos).to(device))
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=cfg.training.lr)
    scheduler = lr_schedule(optimizer, cfg, 10**6)
    run["plain"] = _plain_step(ddp, optimizer, scheduler, cfg, device)

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i, batch in enumerate(batches):
        order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]
        for name in order:
            sync()
            t0 = time.perf_counter()
            run[name](batch)
            sync()
            if i >= warmup:
                times[name].append(1000 * (time.perf_counter() - t0))
    util: dict[str, float | None] = {}
    if cuda and util_s > 0:
        for name in VARIANTS:
            util[name] = _nvml_utilisation(device.index or 0, _cycling(run[name], batches), util_s)
    agreement = []
    for _ in range(steps):
        t0 = time.perf_counter()
        agree_local(oom=False, nonfinite=torch.tensor(False), losses=torch.zeros(2), n_tasks=2,
                    save_failed=False, stop=False, rank=env.rank, world_size=env.world_size,
                    device=device)  # fmt: skip
        agree_update(Update.DONE, rank=env.rank, world_size=env.world_size, device=device)
        agreement.append(1000 * (time.perf_counter() - t0))
    shutdown_distributed()
    samples = sum(x.shape[0] for x, _, _ in batches[0].values()) * env.world_size
    if env.rank == 0:
        record = {**times, "agreement": agreement, "samples_per_step": samples, "util": util}
        params = sum(p.numel() for p in ddp.parameters())
        (out / "rank0.json").write_text(jsonio.dumps({**record, "parameters": params}))


def worker_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """The ranks' environment: ``tree`` first on the import path, then whatever the caller
    had there (the GPU suite's carried wheels: ups's dependencies live only there)."""
    path = [str(tree), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


def _failure(out: Path, proc: subprocess.CompletedProcess[str]) -> str:
    """Why a launch failed: the worker's own error (``error.txt``), else torchrun's tail."""
    written = out / "error.txt"
    if written.is_file():
        return written.read_text().strip()
    return f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"


def _source_tree(ref: str, where: Path) -> Path:
    """The code at git ``ref`` under ``where`` (no worktree metadata), sharing data/."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    (where / "data").symlink_to(REPO / "data")
    return where


def _case(
    name: str, config: Path, args: argparse.Namespace, work: Path, trees: dict[str, Path]
) -> list[dict[str, Any]]:
    """``name`` run under each of ``trees`` (label: code), tries interleaved across them."""
    strategy, size, precision = name.split(":")
    sets = [*STRATEGIES[strategy], *SIZES[size], *PRECISIONS[precision]]
    sets += ["wandb.mode=disabled", f"distributed.backend={args.backend}"]
    sets += ["training.log_every=1000000"]
    sets += [f"training.max_steps={10 * (args.steps + args.warmup)}"]
    drop = ("WANDB_", "UPS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    tries: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    failed: dict[str, str] = {}
    parameters = None
    for i in range(args.repeats):
        for label, tree in trees.items():
            if label in failed:
                continue
            out = work / f"{name.replace(':', '-')}-{label}-{i}"
            out.mkdir(parents=True)
            print(f"running: {name} {label} (try {i + 1}/{args.repeats})", flush=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.nproc}", "--monitor-interval=0.2",
                   str(tree / SCRIPT.relative_to(REPO)), "--worker", str(out), str(config),
                   str(args.steps), str(args.warmup), str(args.util_seconds), *sets]  # fmt: skip
            proc = subprocess.run(cmd, env=worker_env(env, tree), cwd=tree,
                                  capture_output=True, text=True, timeout=1800)  # fmt: skip
            if proc.returncode != 0:
                failed[label] = _failure(out, proc)
                print(f"failed: {name} {label}: {failed[label]}", flush=True)
                continue
            data = json.loads((out / "rank0.json").read_text())
            parameters = data["parameters"]
            tries[label].append(
                {
                    **{f"{v} ms": statistics.median(data[v]) for v in VARIANTS},
                    **{f"{v} samples/s": 1000 * data["samples_per_step"]
                       / statistics.median(data[v]) for v in VARIANTS},
                    **{f"{v} gpu util %": data["util"].get(v) for v in VARIANTS},
                    **{f"{v} / plain": statistics.median(
                        a / b for a, b in zip(data[v], data["plain"], strict=True)
                    ) for v in VARIANTS[:2]},
                    "agreement ms": statistics.median(data["agreement"]),
                }
            )  # fmt: skip
    return [{"case": name, "code": label, "strategy": strategy, "size": size,
             "precision": precision, "parameters": parameters, "ranks": args.nproc,
             "backend": args.backend, "tries": rows, "failed": failed.get(label)}
            for label, rows in tries.items()]  # fmt: skip


def _table(results: list[dict[str, Any]]) -> list[str]:
    def cell(rows: list[dict[str, Any]], key: str, fmt: str) -> str:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            return "-"
        med = statistics.median(values)
        return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = [
        "| code | strategy | model | precision | ups skip ms | ups fail ms | plain ms "
        "| ups skip / plain | ups fail / plain | agreement ms "
        "| samples/s skip, fail, plain | GPU util % skip, fail, plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["tries"]
        if r.get("failed"):
            reason = " ".join(r["failed"].split())[:200].replace("|", "/")
            lines.append(f"| {r['code']} | {r['strategy']} | {r['size']} | {r['precision']} "
                         f"| FAILED: {reason} |" + " |" * 7)  # fmt: skip
            continue
        rates = ", ".join(cell(t, f"{v} samples/s", ".0f") for v in VARIANTS)
        util = ", ".join(cell(t, f"{v} gpu util %", ".0f") for v in VARIANTS)
        lines.append(
            f"| {r['code']} | {r['strategy']} | {r['size']} | {r['precision']} "
            f"| {cell(t, 'ups skip ms', '.1f')} "
            f"| {cell(t, 'ups fail ms', '.1f')} | {cell(t, 'plain ms', '.1f')} "
            f"| {cell(t, 'ups skip / plain', '.3f')} | {cell(t, 'ups fail / plain', '.3f')} "
            f"| {cell(t, 'agreement ms', '.2f')} | {rates} | {util} |"
        )
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        out, config, steps, warmup, util_s, *sets = sys.argv[2:]
        try:
            worker(Path(out), Path(config), int(steps), int(warmup), float(util_s), sets)
        except BaseException as exc:  # the case's reason in its row; the rank still fails
            if os.environ.get("RANK", "0") == "0":
                said = str(exc) if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
                (Path(out) / "error.txt").write_text(said + "\n")
            raise
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per variant per try")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="torchrun launches per case")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one GPU each with nccl)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument(
        "--util-seconds", type=float, default=3.0, help="NVML sampling per variant (CUDA only)"
    )
    everything = [f"{s}:{m}:{p}" for s in STRATEGIES for m in ("demo", "12x") for p in PRECISIONS]
    parser.add_argument("--cases", nargs="+", default=everything, help="strategy:size:precision")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "step-cpu")
    parser.add_argument("--compare", metavar="REF", help="the code at git REF vs this, ABAB")
    args = parser.parse_args()
    if args.config == DEMO_CONFIG and not (REPO / "data" / "demo").is_dir():
        subprocess.run([str(REPO / ".venv" / "bin" / "ups"), "data", "synth"], check=True, cwd=REPO)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        trees = {"this": REPO}
        if args.compare:
            trees = {"before": _source_tree(args.compare, Path(tmp, "before")), "after": REPO}
        results = [
            r for name in args.cases for r in _case(name, args.config, args, Path(tmp), trees)
        ]
    import torch

    head = [
        f"ups step vs plain DDP step, {args.backend} x {args.nproc} rank(s) - "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU "
        f"cores shared with other jobs (load average at start {load}); {args.nproc} ranks; "
        f"{args.steps} steps per variant per try after {args.warmup} warm-up, rotating order; "
        f"{args.repeats} tries per case; each cell: median over tries (min-max)",
        f"command: python {' '.join(sys.argv)}",
        "",
    ]
    text = "\n".join([*head, *_table(results)]) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(text)
    args.out.with_suffix(".json").write_text(jsonio.dumps(results, indent=2) + "\n")
    failed = [f"{r['case']} ({r['code']})" for r in results if r["failed"]]
    if failed:
        raise SystemExit(f"{len(failed)} case(s) failed: {', '.join(failed)} (table above)")


if __name__ == "__main__":
    main()
