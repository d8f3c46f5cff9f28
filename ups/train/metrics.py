"""Relative L2 error, the PDEBench-style metric and our training loss."""

from __future__ import annotations

import torch
from torch import Tensor

from ups.data.pdebench import PDEBenchDataset


def rel_l2(pred: Tensor, target: Tensor, eps: float = 1e-12) -> Tensor:
    """Per-sample ``||pred - target|| / ||target||`` over all channels and grid points."""
    diff = (pred - target).flatten(1).norm(dim=1)
    out: Tensor = diff / target.flatten(1).norm(dim=1).clamp_min(eps)
    return out


def mean_target(dataset: PDEBenchDataset, limit: int = 256) -> Tensor:
    """Mean of the first ``limit`` targets: the baseline for steady tasks (no previous frame)."""
    n = min(len(dataset), limit)
    total = sum(dataset[i][1] for i in range(n))
    return torch.as_tensor(total) / n
