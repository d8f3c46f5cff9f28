"""What the fault-safe FSDP step costs against a plain FSDP2 step (CPU, gloo, 2 ranks).

Run from the repository root::

    .venv/bin/python benchmarks/bench_fsdp.py                 # 3 tries, 20 steps each
    .venv/bin/python benchmarks/bench_fsdp.py --repeats 5 --steps 40
    .venv/bin/python benchmarks/bench_fsdp.py --precision bf16   # both steps under autocast

For each model size (the demo's, ``model.latent_dim=64, depth=2``, and about 10x the
parameters, ``latent_dim=144, depth=4``), each of ``--repeats`` torchrun launches (2
ranks, gloo, one thread each, ``--precision`` fp32 or bf16) builds both steps on the
same model initialisation and times them on the same batches, taking turns (ABAB: A
then B on even batches, B then A on odd ones, so drift and bursts of load from other
jobs hit both alike):

- **ups**: ``Trainer.train_step`` under ``training.strategy=fsdp`` (``ups.distributed.fsdp``:
  one all-gather at the start, backward with no collective, the agreement, one gradient
  all-reduce, clip and AdamW on the local shards, the second agreement);
- **plain**: what a hand-written FSDP2 loop does: ``fully_shard`` on each transformer
  block and the root (defaults: reshard after forward, reduce-scatter in backward),
  forward, the same weighted loss, backward, ``clip_grad_norm_``, AdamW, scheduler.

Rank 0's times are reported: median ms/step of each, and the median of the per-batch
ratios (a batch's two steps ran back to back, so the ratio cancels slow drift), with the
spread over the tries. Results go to stdout and ``--out``
(default ``benchmarks/results/fsdp-cpu.txt``, ``fsdp-cpu-bf16.txt`` for bf16).
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
CONFIG = REPO / "configs" / "demo.yaml"
DATA = REPO / "data" / "demo"
SIZES = {"demo": ["model.latent_dim=64", "model.depth=2"],
         "10x": ["model.latent_dim=144", "model.depth=4", "model.heads=4"]}  # fmt: skip


def _plain(cfg: Any, infos: Any, device: Any, total: int) -> Any:
    """A plain FSDP2 model, optimizer and step function, from the same seed as the trainer's."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ups.train.amp import autocast
    from ups.train.metrics import rel_l2
    from ups.train.run import make_model
    from ups.train.schedule import lr_schedule

    torch.manual_seed(0)
    model = make_model(cfg, infos).to(device)
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for block in model.operator.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay
    )
    scheduler = lr_schedule(optimizer, cfg, total)
    weights = torch.tensor([t.weight for t in cfg.tasks], device=device)

    def step(batch: Any) -> None:
        with autocast(cfg.training.precision, device):  # as the trainer: forward only
            preds = model({t: x.to(device) for t, (x, _, _) in batch.items()}, None)
        y = {t: batch[t][1].to(device) for t in batch}
        losses = torch.stack([rel_l2(preds[t].float(), y[t]).mean() for t in batch])
        ((weights * losses).sum() / weights.sum()).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def worker(out: Path, overrides: list[str], steps: int, warmup: int) -> None:
    """One rank: time both steps on the same batches and write ``out/rank<N>.json``."""
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

    env = read_dist_env()
    setup_logging(rank=env.rank, stdout=open(os.devnull, "w"))  # noqa: SIM115  # process-long
    cfg = load_config(CONFIG, overrides)
    infos = {task.name: inspect_task(task) for task in cfg.tasks}
    device = init_distributed(env, cfg.distributed)
    t = cfg.training
    loader = build_loader(list(cfg.tasks), infos, batch_size=t.batch_size, num_workers=0,
                          rank=env.rank, world_size=env.world_size, seed=0)  # fmt: skip
    loader.set_epoch(0)
    batches = [b for _, b in zip(range(warmup + steps), loader, strict=False)]
    torch.manual_seed(0)
    trainer = build_trainer(cfg, env, infos, device, loader=loader, tracker=Tracker(),
                            stop=StopFlag(), checkpoint_dir=out / "unused")  # fmt: skip
    plain = _plain(cfg, infos, device, trainer.total_steps)
    params = sum(p.numel() for p in trainer.params)
    times: dict[str, list[float]] = {"ups": [], "plain": []}
    for i, batch in enumerate(batches):
        for which in ("ups", "plain") if i % 2 == 0 else ("plain", "ups"):
            t0 = time.perf_counter()
            if which == "ups":
                trainer.train_step(batch, epoch=0)
            else:
                plain(batch)
            if i >= warmup:
                times[which].append(1000 * (time.perf_counter() - t0))
    shutdown_distributed()
    (out / f"rank{env.rank}.json").write_text(json.dumps({**times, "params": params}))


def run_size(
    size: str, precision: str, steps: int, warmup: int, repeats: int, work: Path
) -> list[str]:
    drop = ("WANDB_", "UPS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    sets = [*SIZES[size], "training.strategy=fsdp", f"training.precision={precision}",
            "wandb.mode=disabled",
            "distributed.backend=gloo", "training.log_every=1000000",
            f"training.max_steps={2 * (steps + warmup) + 1}"]  # fmt: skip
    rows, ratios, params = [], [], 0
    for i in range(repeats):
        out = work / f"{size}-{i}"
        out.mkdir(parents=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "--monitor-interval=0.2", str(SCRIPT), "--worker",
               str(out), str(steps), str(warmup), *sets]  # fmt: skip
        print(f"running: {size} (try {i + 1}/{repeats})", flush=True)
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"fsdp benchmark failed:\n{proc.stderr[-3000:]}")
        data = json.loads((out / "rank0.json").read_text())
        params = data["params"]
        ups, plain = statistics.median(data["ups"]), statistics.median(data["plain"])
        paired = statistics.median(a / b for a, b in zip(data["ups"], data["plain"], strict=True))
        ratios.append(paired)
        rows.append(f"  try {i + 1}: median ms/step ups {ups:.2f}, plain {plain:.2f}; "
                    f"median of per-batch ratios {paired:.3f}")  # fmt: skip
    return [
        f"{size} ({params:,} parameters): ups/plain median {statistics.median(ratios):.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f} over {repeats} tries",
        *rows,
    ]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        out, steps, warmup, *overrides = sys.argv[2:]
        worker(Path(out), overrides, int(steps), int(warmup))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    suffix = "" if args.precision == "fp32" else f"-{args.precision}"
    out = args.out or REPO / "benchmarks" / "results" / f"fsdp-cpu{suffix}.txt"
    if not DATA.is_dir():
        subprocess.run([sys.executable, "-m", "ups", "data", "synth", "--out", str(DATA)],
                       check=True, cwd=REPO)  # fmt: skip
    import torch

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [
        f"ups FSDP step vs plain FSDP2 step, CPU/gloo - {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}"
        " UTC",
        f"configs/demo.yaml, {args.precision}, torchrun 2 ranks x 1 thread, {args.steps} steps "
        f"of each kind per try after {args.warmup} warm-up, ABAB on the same batches, "
        "rank 0's times; "
        f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU "
        f"cores shared with other jobs (load average at start {load})",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            lines += run_size(
                size, args.precision, args.steps, args.warmup, args.repeats, Path(tmp)
            )
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
