"""Per-step cost of the issue-9 agreement, side by side with the step it replaced.

Used by ``bench_train.py --agreement``. In each of ``--repeats`` torchrun launches (2
ranks, gloo, one thread each) every rank builds the real trainer, holds a fixed list of
batches in memory, and times two steps on each batch, taking turns (ABBA order, so drift
and bursts of load from other jobs hit both alike):

- **now**: ``Trainer.train_step`` (two agreement points, per-rank status rows with the
  losses, the local NaN/inf check over the flat gradient buffer, pre-allocated buffers);
- **before**: :func:`previous_train_step`, the step as it was at commit 35dd9c7 (one
  ``all_reduce(MAX)`` of OOM/stop flags, a flat buffer built by ``torch.cat`` each step,
  no finiteness check), kept here only to measure against.

Both update the same model, so both do the full work of a step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def previous_train_step(trainer: Any, batch: Any) -> None:
    """The training step before rank agreement (commit 35dd9c7), minus logging."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from ups.distributed.agreement import heartbeat

    env, step = trainer.env, trainer.state.step
    oom = False
    try:
        losses = trainer.forward_backward(batch, step, sync=False)
    except torch.OutOfMemoryError:
        oom = True
        trainer.optimizer.zero_grad(set_to_none=True)
    heartbeat(env.rank, step)
    flags = torch.zeros(env.world_size + 1, device=trainer.device)
    flags[env.rank] = float(oom)
    flags[env.world_size] = float(trainer.stop.is_set())
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if any(v > 0 for v in flags.tolist()[: env.world_size]):
        trainer.optimizer.zero_grad(set_to_none=True)
        return
    params = trainer.params
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [losses.detach().reshape(-1)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= env.world_size
    offset = 0
    for p, g in zip(params, grads, strict=True):
        chunk = flat[offset : offset + g.numel()].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += g.numel()
    if trainer.cfg.training.grad_clip > 0:
        nn.utils.clip_grad_norm_(params, trainer.cfg.training.grad_clip)
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)


def worker(out: Path, config: Path, overrides: list[str], steps: int, warmup: int) -> None:
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
    cfg = load_config(config, overrides)
    infos = {task.name: inspect_task(task) for task in cfg.tasks}
    device = init_distributed(env, cfg.distributed)
    loader = build_loader(
        list(cfg.tasks),
        infos,
        batch_size=cfg.training.batch_size,
        num_workers=0,
        rank=env.rank,
        world_size=env.world_size,
        seed=0,
    )
    loader.set_epoch(0)
    batches = [b for _, b in zip(range(warmup + steps), loader, strict=False)]
    torch.manual_seed(0)
    trainer = build_trainer(
        cfg,
        env,
        infos,
        device,
        loader=loader,
        tracker=Tracker(),
        stop=StopFlag(),
        checkpoint_dir=out / "unused-checkpoints",
    )
    now: list[float] = []
    before: list[float] = []
    for i, batch in enumerate(batches):
        order = ("now", "before") if i % 2 == 0 else ("before", "now")
        for which in order:
            t0 = time.perf_counter()
            if which == "now":
                trainer.train_step(batch, epoch=0)
            else:
                previous_train_step(trainer, batch)
                trainer.state.step += 1
            ms = 1000 * (time.perf_counter() - t0)
            if i >= warmup:
                (now if which == "now" else before).append(ms)
    shutdown_distributed()
    (out / f"rank{env.rank}.json").write_text(json.dumps({"now": now, "before": before}))


def run(
    script: Path, config: Path, overrides: list[str], *, steps: int, warmup: int, repeats: int,
    work: Path,
) -> list[str]:  # fmt: skip
    """Launch ``repeats`` 2-rank runs and return the report's lines."""
    rows, ratios = [], []
    drop = ("WANDB_", "UPS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    sets = [*overrides, "wandb.mode=disabled", "distributed.backend=gloo"]
    sets += ["training.log_every=1000000", f"training.max_steps={2 * (steps + warmup) + 1}"]
    for i in range(repeats):
        out = work / f"agreement{i}"
        out.mkdir(parents=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "--monitor-interval=0.2", str(script), "--agreement-worker",
               str(out), str(config), str(steps), str(warmup), *sets]  # fmt: skip
        print(f"running: agreement cost (try {i + 1}/{repeats})", flush=True)
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"agreement benchmark failed:\n{proc.stderr[-3000:]}")
        data = json.loads((out / "rank0.json").read_text())
        now, before = statistics.median(data["now"]), statistics.median(data["before"])
        # Each batch's two steps ran back to back: their ratio cancels slow drifts in load.
        paired = statistics.median(a / b for a, b in zip(data["now"], data["before"], strict=True))
        ratios.append(paired)
        rows.append(
            f"try {i + 1}: median ms/step now {now:.2f}, before {before:.2f}; median of "
            f"per-batch ratios {paired:.3f} ({len(data['now'])} steps each)"
        )
    spread = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    return [
        f"Per-step cost of the issue-9 agreement (torchrun, 2 ranks, gloo, 1 thread each; "
        f"{steps} steps of each kind per try after {warmup} warm-up, taking turns on the same "
        "batches; rank 0's times)",
        *rows,
        f"step time now/before (median of per-batch ratios): mean {statistics.fmean(ratios):.3f}, "
        f"{spread} over {repeats} tries",
    ]
