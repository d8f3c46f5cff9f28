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


def output_scale(
    dataset: PDEBenchDataset, steady: bool, offset: Tensor | None = None, limit: int = 256
) -> float:
    """RMS of what the decoder must predict: ``y - offset`` (steady) or ``y - x`` (time tasks).

    Computed from the first ``limit`` training items, so every rank gets the same value.
    """
    n = min(len(dataset), limit)
    total = 0.0
    for i in range(n):
        x, y, _ = dataset[i]
        target = y - (offset if offset is not None else 0.0) if steady else y - x
        total += float(target.pow(2).mean())
    rms: float = (total / max(n, 1)) ** 0.5
    return max(rms, 1e-8)
