"""FSDP2 with the DDP path's guarantee: no collective between a step's start and its agreement.

FSDP2 (``fully_shard``) all-gathers parameters in its forward hooks and reduce-scatters
gradients in its backward hooks. Left that way, a rank that runs out of memory inside
forward or backward skips the rest of it while its peers wait in the next all-gather or
reduce-scatter, and the step's agreement (``ups.distributed.agreement``) is never reached:
the hang the project exists to prevent. So the collectives are moved to fixed points:

- :func:`begin_step`, before any fallible work, on every rank, on every path: reset
  FSDP's per-iteration state (after an exception mid-forward/backward it is half-way)
  and ``unshard()`` the whole model: the step's one all-gather. With
  ``reshard_after_forward=False`` and ``reshard_after_backward=False`` forward and
  backward then run on the gathered parameters with no collective at all.
- backward runs with ``set_requires_gradient_sync(False)``: FSDP leaves each full
  gradient on the gathered parameter; :class:`ShardedGrads` packs them into one flat
  buffer allocated at start (checked for NaN/inf as the DDP buffer is).
- after the agreement, only if every rank is clean: one all-reduce of that buffer, then
  ``reshard()`` (local) and each rank keeps its own dim-0 slice as the sharded gradient.
  Clipping uses the norm of the averaged buffer, identical on every rank, so the update
  (clip, AdamW on the local shards, scheduler) needs no collective either.

What this keeps of FSDP: parameters, gradients and AdamW's state are sharded between
steps (the optimizer state, twice the model, is what does not fit), and checkpoints are
sharded. What it gives up: during a step every rank holds the whole model and its whole
gradient (no per-layer gather and free), and the gradient all-reduce is not overlapped
with backward. On NCCL a reduce-scatter into the local slices would halve the gradient
traffic; gloo has none (it emulates it with an all-reduce anyway).

An out-of-memory error inside FSDP's own collectives (the all-gather's output buffer in
:func:`begin_step`, or the gradient all-reduce) is not caught: it leaves this rank
between collectives, so it is a rank failure like a segfault. The rank exits, torchrun
stops the others, and a peer already waiting in that collective is released by the
connection closing or, at the latest, by ``distributed.collective_timeout_s``
(``init_timeout_s`` on an attempt's first step). Nothing waits unbounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard

from ups.distributed.agreement import exchange


def shard_model(model: nn.Module, device: torch.device, world_size: int) -> FSDPModule:
    """``fully_shard`` the model over a 1-D mesh of every rank, for the fixed-point step.

    The mesh is passed explicitly: with gloo on a CPU host, letting FSDP guess the device
    moved parameters to CUDA in torch 2.4 (pytorch/pytorch#132471).
    """
    mesh = init_device_mesh(device.type, (world_size,))
    sharded = fully_shard(model, mesh=mesh, reshard_after_forward=False)
    sharded.set_requires_gradient_sync(False)
    sharded.set_reshard_after_backward(False)
    return sharded


def _mesh(model: FSDPModule) -> DeviceMesh:
    first = next(p for p in cast(nn.Module, model).parameters())
    assert isinstance(first, DTensor), "the model must be resharded here"
    return first.device_mesh


class StepGather:
    """The one all-gather of every step, at a fixed point (see the module docstring)."""

    def __init__(self, model: FSDPModule) -> None:
        self.model = model
        self._forwarded = False

    def begin_step(self) -> None:
        """Every rank, every step, before anything that may fail: gather the parameters."""
        if self._forwarded:
            # Local: waits for nothing in flight (there is none) and reshards every group.
            self.model.reset_iter_state()
        self._forwarded = True
        self.model.unshard()
        for p in cast(nn.Module, self.model).parameters():
            p.grad = None  # a skipped step's gradients must not leak into this one


class ShardedGrads:
    """The FSDP counterpart of ``GradBuffer``: full gradients packed into one flat buffer
    allocated at start, all-reduced there, and each rank keeps its shard."""

    def __init__(self, model: FSDPModule, rank: int, world_size: int) -> None:
        self.model, self.rank, self.world_size = model, rank, world_size
        self.params = [p for p in cast(nn.Module, model).parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]  # global sizes (DTensor.numel)
        first = self.params[0]
        assert isinstance(first, DTensor)
        self.flat = torch.empty(sum(self.sizes), dtype=first.dtype, device=first.to_local().device)

    def _gathered(self) -> Iterator[Tensor]:
        gathered = [p for p in cast(nn.Module, self.model).parameters() if p.requires_grad]
        assert not any(isinstance(p, DTensor) for p in gathered), "begin_step() not called"
        return iter(gathered)

    def attach(self) -> None:
        """Nothing to do: ``StepGather.begin_step`` cleared the gathered gradients."""

    def nonfinite(self) -> Tensor:
        """Copy each full local gradient (zeros when absent) into the buffer; a 0-d bool
        tensor, True when any value is NaN/inf (no host sync)."""
        offset = 0
        for p, n in zip(self._gathered(), self.sizes, strict=True):
            chunk = self.flat[offset : offset + n]
            if p.grad is None:
                chunk.zero_()
            else:
                chunk.copy_(p.grad.reshape(-1))
                p.grad = None
            offset += n
        return ~torch.isfinite(self.flat).all()

    def exchange(self, row: Tensor, rank: int, world_size: int) -> list[list[float]]:
        """Point 1: every rank's status row (the gradients travel after it, in average)."""
        return exchange(row, rank, world_size)

    def average(self, world_size: int) -> None:
        """After the agreement only: average the buffer across ranks in place, reshard
        (local) and give each sharded parameter its slice of the averaged gradient."""
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)
        self.flat /= world_size
        self.model.reshard()
        mesh = _mesh(self.model)
        offset = 0
        for p, n in zip(self.params, self.sizes, strict=True):
            full = self.flat[offset : offset + n].view(p.shape)
            offset += n
            # fully_shard splits dim 0 as torch.chunk does; trailing ranks may get nothing.
            chunks = full.chunk(self.world_size, dim=0)
            local = chunks[self.rank] if self.rank < len(chunks) else full[:0]
            p.grad = DTensor.from_local(
                local, mesh, [Shard(0)], shape=p.shape, stride=p.stride(), run_check=False
            )

    def zero(self) -> None:
        """Drop the sharded gradients (views of the buffer, rewritten next step)."""
        for p in self.params:
            p.grad = None

    def clip_(self, max_norm: float) -> None:
        """Scale the gradients to at most ``max_norm`` (the global norm, as
        ``clip_grad_norm_`` computes it), from the averaged buffer: no collective."""
        norm = torch.linalg.vector_norm(self.flat)
        self.flat.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))  # the shards are views
