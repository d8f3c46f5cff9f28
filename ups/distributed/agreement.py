"""The fixed point where every rank meets every step.

Each step every rank computes its gradients locally (no collective inside a
forward/backward that might fail), then all ranks join exactly one status
``all_reduce(MAX)`` carrying "did I run out of memory" and "was I asked to stop",
then (only if nobody failed) one gradient ``all_reduce``. No rank ever calls a
collective from an ``except`` block, so one rank's failure cannot leave the others
waiting in a collective it never joins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

_HEARTBEAT = "ups/heartbeat/{rank}"


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """What every rank agreed on at the end of a step's local work."""

    oom_ranks: tuple[int, ...]
    """Ranks that ran out of memory; when non-empty every rank skips the step."""
    stop: bool
    """Some rank received SIGTERM: every rank stops after this step."""

    @property
    def skip(self) -> bool:
        return bool(self.oom_ranks)


def agree(
    *, oom: bool, stop: bool, rank: int, world_size: int, device: torch.device
) -> StepVerdict:
    """Join the per-step status collective. Every rank calls this exactly once per step."""
    flags = torch.zeros(world_size + 1, device=device)
    flags[rank] = float(oom)
    flags[world_size] = float(stop)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    values = flags.tolist()
    return StepVerdict(
        oom_ranks=tuple(r for r in range(world_size) if values[r] > 0),
        stop=values[world_size] > 0,
    )


def average_gradients(params: Iterable[Tensor], extras: Tensor, world_size: int) -> Tensor:
    """Average every parameter's gradient across ranks in one all-reduce.

    ``extras`` (e.g. per-task losses) ride along in the same buffer; their average
    across ranks is returned.
    """
    params = [p for p in params if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [extras.reshape(-1).to(grads[0].dtype)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for p, g in zip(params, grads, strict=True):
        chunk = flat[offset : offset + g.numel()].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += g.numel()
    return flat[offset:].clone()


def heartbeat(rank: int, step: int) -> None:
    """Record in the rendezvous store the step this rank has reached (read after a hang)."""
    store = dist.distributed_c10d._get_default_store()
    store.set(_HEARTBEAT.format(rank=rank), str(step))


def stuck_ranks(world_size: int, step: int) -> list[int]:
    """Ranks whose last heartbeat is behind ``step`` (best effort; empty when unknown)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        return []
    behind = []
    for rank in range(world_size):
        key = _HEARTBEAT.format(rank=rank)
        try:
            reached = int(store.get(key)) if store.check([key]) else -1
        except (RuntimeError, ValueError):
            continue
        if reached < step:
            behind.append(rank)
    return behind
