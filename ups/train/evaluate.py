"""Held-out relative L2 error, reduced exactly across ranks, next to a naive baseline.

The baseline is persistence (predict the previous frame) for time-dependent tasks and
the mean training solution for steady ones (Darcy has no previous frame).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ups.config import Config
from ups.data.loader import build_eval_loader
from ups.data.pdebench import PDEBenchDataset, TaskInfo
from ups.distributed.env import DistEnv
from ups.model import LatentOperator
from ups.train.metrics import mean_target, rel_l2


@torch.no_grad()
def evaluate(
    model: LatentOperator,
    cfg: Config,
    infos: dict[str, TaskInfo],
    env: DistEnv,
    device: torch.device,
) -> dict[str, float]:
    """Return ``eval/<task>/rel_l2``, ``eval/<task>/baseline_rel_l2`` and sample counts.

    Every rank runs the same collectives in the same task order, even with no samples.
    """
    model.eval()
    metrics: dict[str, float] = {}
    for task in cfg.tasks:
        info = infos[task.name]
        baseline_field: Tensor | None = None
        if info.steady:
            baseline_field = mean_target(PDEBenchDataset(task, "train", info)).to(device)
        loader = build_eval_loader(
            task,
            info,
            batch_size=cfg.training.eval_batch_size,
            rank=env.rank,
            world_size=env.world_size,
        )
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        for x, y, _ in loader:
            x, y = x.to(device), y.to(device)
            pred = model({task.name: x})[task.name]
            base = baseline_field.expand_as(y) if baseline_field is not None else x
            sums[0] += rel_l2(pred, y).sum()
            sums[1] += rel_l2(base, y).sum()
            sums[2] += len(y)
        dist.all_reduce(sums)
        err, base_err, count = sums.tolist()
        metrics[f"eval/{task.name}/rel_l2"] = err / max(count, 1)
        metrics[f"eval/{task.name}/baseline_rel_l2"] = base_err / max(count, 1)
        metrics[f"eval/{task.name}/samples"] = count
    model.train()
    return metrics
