"""One flat gradient buffer, allocated once, that backward writes into and the all-reduce
runs in.

Every parameter's ``.grad`` is a view of its slice of the buffer (as DDP's
``gradient_as_bucket_view``), so autograd accumulates each micro-batch's gradient into
the buffer in place: there is no copy from ``.grad`` into a staging buffer and none back,
and nothing is allocated per step, so the all-reduce staging cannot run out of memory
mid-run.

The buffer ends with a slot for every rank's status row (``ups.distributed.agreement``,
point 1), so the step's first agreement and the gradient sum are one ``all_reduce``
(:meth:`GradBuffer.exchange`): one rendezvous of the ranks instead of two. The summed
gradients are used only when the rows say every rank is clean (:meth:`GradBuffer.average`);
otherwise they are cleared unread, as a rank that failed sent zeros or garbage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class GradBuffer:
    """The gradients of ``params`` as views of one preallocated tensor."""

    def __init__(self, params: Sequence[Tensor], status_len: int = 0) -> None:
        """``status_len``: room for the status table (every rank's row) after the gradients."""
        self.params = list(params)
        size = sum(p.numel() for p in self.params)
        self.buffer = torch.zeros(
            size + status_len, dtype=self.params[0].dtype, device=self.params[0].device
        )
        # One contributor per table element, so its sum is exact; the losses in it are
        # fp32 and must stay so (ups keeps fp32 parameters; autocast lowers the compute).
        assert status_len == 0 or self.buffer.dtype in (torch.float32, torch.float64)
        self.flat = self.buffer[:size]
        self.status = self.buffer[size:]
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
        """A 0-d bool tensor on the device: True when any gradient is NaN/inf (no host sync;
        the agreement reads it). One pass that allocates nothing: min and max propagate
        NaN, are inf when any value is, and cannot overflow (``isfinite(...).all()`` is
        two passes and a temporary, about 15x slower on a CPU)."""
        low, high = torch.aminmax(self.flat)
        return ~(torch.isfinite(low) & torch.isfinite(high))

    def exchange(self, row: Tensor, rank: int, world_size: int) -> list[list[float]]:
        """Point 1: every rank's status ``row`` as a table indexed by rank, from the same
        ``all_reduce(SUM)`` that sums the gradients; each rank fills only its own row."""
        table = self.status.view(world_size, -1)
        table.zero_()
        table[rank] = row
        dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM)
        rows: list[list[float]] = table.tolist()
        return rows

    def average(self, world_size: int) -> None:
        """After :meth:`exchange`, only when every rank was clean: the summed gradients
        divided by the world size, in place."""
        self.flat /= world_size
