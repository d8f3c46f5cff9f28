"""One flat gradient buffer, allocated once, that backward writes into and the all-reduce
runs in.

Every parameter's ``.grad`` is a view of its slice of the buffer (as DDP's
``gradient_as_bucket_view``), so autograd accumulates each micro-batch's gradient into
the buffer in place: there is no copy from ``.grad`` into a staging buffer and none back,
and nothing is allocated per step, so the all-reduce staging cannot run out of memory
mid-run. The all-reduce runs in place on the whole buffer (one collective, launched as
soon as the ranks agree the step is clean).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class GradBuffer:
    """The gradients of ``params`` as views of one preallocated tensor."""

    def __init__(self, params: Sequence[Tensor]) -> None:
        self.params = list(params)
        self.flat = torch.zeros(
            sum(p.numel() for p in self.params),
            dtype=self.params[0].dtype,
            device=self.params[0].device,
        )
        self.views: list[Tensor] = []
        offset = 0
        for p in self.params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.attach()

    def attach(self) -> None:
        """Point every ``.grad`` at its view (again: ``zero_grad(set_to_none=True)`` or an
        optimizer's state set-up may have dropped them). Cheap: no data moves."""
        for p, view in zip(self.params, self.views, strict=True):
            if p.grad is not view:
                p.grad = view

    def zero(self) -> None:
        """Clear the gradients for the next step, keeping the views."""
        self.flat.zero_()
        self.attach()

    def nonfinite(self) -> Tensor:
        """A 0-d bool tensor on the device: True when any gradient is NaN/inf (one pass over
        the buffer, no host sync; the agreement reads it)."""
        return ~torch.isfinite(self.flat).all()

    def all_reduce_mean(self, world_size: int) -> None:
        """Average the buffer across ranks, in place (NCCL averages in the collective)."""
        if dist.get_backend() == dist.Backend.NCCL:
            dist.all_reduce(self.flat, op=dist.ReduceOp.AVG)
            return
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)  # gloo has no AVG
        self.flat /= world_size
