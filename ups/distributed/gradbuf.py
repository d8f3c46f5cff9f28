"""One flat gradient buffer, allocated once, that every step's all-reduce runs in.

Allocating it at start (not per step, as ``torch.cat`` would) means the all-reduce
staging cannot run out of memory mid-run: packing copies into it, the all-reduce runs
in place, and unpacking only makes views of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class GradBuffer:
    """Gradients of ``params`` plus ``n_extras`` values (per-task losses) in one tensor."""

    def __init__(self, params: Sequence[Tensor], n_extras: int) -> None:
        self.params = list(params)
        self.sizes = [p.numel() for p in self.params]
        total = sum(self.sizes)
        self.flat = torch.empty(
            total + n_extras, dtype=self.params[0].dtype, device=self.params[0].device
        )
        self.extras = self.flat[total:]

    def pack(self, extras: Tensor) -> Tensor:
        """Copy each local gradient (zeros when absent) and ``extras`` into the buffer.

        Returns a 0-d bool tensor on the device: True when any packed value is NaN/inf
        (one pass over the buffer; no host sync).
        """
        offset = 0
        for p, n in zip(self.params, self.sizes, strict=True):
            chunk = self.flat[offset : offset + n]
            if p.grad is None:
                chunk.zero_()
            else:
                chunk.copy_(p.grad.reshape(-1))
            offset += n
        self.extras.copy_(extras.reshape(-1))
        return ~torch.isfinite(self.flat).all()

    def all_reduce_mean(self, world_size: int) -> None:
        """Average the buffer across ranks, in place."""
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)
        self.flat /= world_size

    def unpack(self) -> Tensor:
        """Point each parameter's ``.grad`` at its averaged slice; return the averaged extras."""
        offset = 0
        for p, n in zip(self.params, self.sizes, strict=True):
            p.grad = self.flat[offset : offset + n].view_as(p)
            offset += n
        return self.extras.clone()
