"""Gradient accumulation: one optimizer step's batch split into micro-batches.

The loader yields ``batch_size * accum_steps`` samples per task per step (so the data
order, the epoch length and the resume position are those of one big batch), and the
step runs them ``batch_size`` at a time. Each micro-batch's per-task mean loss is weighted
by its share of that task's samples, so the summed gradient is the gradient of the whole
batch's mean loss: ``accum_steps: 4, batch_size: 8`` computes what ``batch_size: 32``
does, to floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

Batch = dict[str, tuple[Tensor, Tensor, Tensor]]


@dataclass(frozen=True, slots=True)
class MicroBatch:
    batch: Batch
    """``{task: (x, y, idx)}`` for the tasks present in this micro-batch."""
    shares: dict[str, float]
    """Each present task's share of its samples in the whole step (they sum to 1 per task)."""


def micro_batches(batch: Batch, size: int) -> list[MicroBatch]:
    """Split every task's step batch into chunks of at most ``size`` samples.

    A task with fewer chunks than the longest joins the last micro-batches, never the first:
    the last micro-batch holds every task, so the backward that runs with DDP's gradient
    synchronisation on (``oom_policy: fail``) uses every parameter, as DDP requires.
    """
    chunks = {
        t: list(zip(*(torch.split(part, size) for part in b), strict=True))
        for t, b in batch.items()
    }
    count = max(len(c) for c in chunks.values())
    totals = {t: len(b[0]) for t, b in batch.items()}
    out = []
    for k in range(count):
        micro: Batch = {}
        shares = {}
        for task, parts in chunks.items():
            j = k - (count - len(parts))
            if j >= 0:
                x, y, idx = parts[j]
                micro[task] = (x, y, idx)
                shares[task] = len(x) / totals[task]
        out.append(MicroBatch(micro, shares))
    return out
