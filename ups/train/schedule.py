"""What a run's length and pace are made of: the step counters a checkpoint keeps, the
number of steps, the learning-rate schedule, and AdamW's state allocated before the first
step (so no step can run out of memory allocating it)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from ups.config import Config


@dataclass(kw_only=True)
class TrainState:
    step: int = 0
    """Batches consumed so far (skipped ones included): the position in the data."""
    updates: int = 0
    """Optimizer updates applied."""
    skipped: int = 0
    """Steps skipped because a rank ran out of memory (no update applied)."""
    consecutive_skips: int = 0
    """Skips in a row; ``training.max_consecutive_skips`` of them fail the run."""

    def as_dict(self) -> dict[str, int]:
        """The counters as stored in a checkpoint (``train_state``)."""
        return asdict(self)


def total_steps(cfg: Config, steps_per_epoch: int) -> int:
    """Steps in the whole run: ``training.max_steps`` or every epoch."""
    return cfg.training.max_steps or cfg.training.epochs * steps_per_epoch


def lr_schedule(
    optimizer: torch.optim.Optimizer, cfg: Config, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` (or constant) over the run."""
    t = cfg.training
    warmup = min(t.warmup_steps, max(total_steps - 1, 0))

    def factor(update: int) -> float:
        if update < warmup:
            return (update + 1) / warmup
        if t.schedule == "constant":
            return 1.0
        progress = min((update - warmup) / max(total_steps - warmup, 1), 1.0)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate the optimizer's state now, so no later step can run out of memory there.

    AdamW allocates ``exp_avg``/``exp_avg_sq`` lazily in its first ``step()``. One step
    with ``lr=0`` on zero gradients allocates them and changes no parameter (AdamW's
    update is ``p *= 1 - lr*wd; p -= lr * ...``); the step counters are then reset, so the
    first real step sees exactly the state a fresh optimizer would create.
    """
    lrs = [group["lr"] for group in optimizer.param_groups]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    for p in params:
        p.grad = None
        counter = optimizer.state[p].get("step")
        if isinstance(counter, Tensor):
            counter.zero_()
