"""The fixed points where every rank meets every step.

Every rank-local event (out of memory, a non-finite loss or gradient, a failed
checkpoint save on rank 0, SIGTERM) becomes a per-rank status row, and all ranks
exchange their rows in one ``all_reduce`` at a fixed place in the step. Every rank then
reads the same table and reacts the same way. No rank ever calls a collective from an
``except`` block, so one rank's failure cannot leave the others waiting in a
collective it never joins.

A step has two such points, reached on every path (see ``ups.train.loop``):

1. :func:`agree_local` after the local work (forward, backward, packing the gradients
   into the flat buffer); only if every rank is clean are the gradients averaged and
   used. Under DDP the table travels in the tail of the flat gradient buffer, so this
   point and the gradient sum are one collective (``GradBuffer.exchange``): a rank that
   failed sends zeros or garbage there, and nobody reads them;
2. :func:`agree_update` after the update (unpacking, clipping, optimizer, scheduler).

The exchange is an ``all_reduce(SUM)`` of a ``world_size x fields`` table in which each
rank fills only its own row, so the sum is every rank's row side by side. NaN and inf
losses survive the sum unchanged (``x + 0``), which is how they reach the reason text.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

_HEARTBEAT = "ups/heartbeat/{rank}"
_WHERE = "ups/where/{rank}"
_FAILED = "ups/failed/{rank}"


def status_length(n_tasks: int) -> int:
    """Fields in one rank's row at point 1: oom, non-finite, save failed, stop, each loss."""
    return 4 + n_tasks


def exchange(row: Tensor, rank: int, world_size: int) -> list[list[float]]:
    """Every rank's ``row`` (same length on every rank), as a table indexed by rank."""
    table = torch.zeros(world_size, row.numel(), dtype=torch.float64, device=row.device)
    table[rank] = row.to(torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.SUM)
    rows: list[list[float]] = table.tolist()
    return rows


@dataclass(frozen=True, slots=True)
class LocalVerdict:
    """What every rank agreed on after the step's local work."""

    oom_ranks: tuple[int, ...]
    """Ranks that ran out of memory in forward, backward or packing the gradients."""
    nonfinite_ranks: tuple[int, ...]
    """Ranks whose loss or local gradients hold NaN or inf."""
    losses: tuple[tuple[float, ...], ...]
    """Each rank's per-task losses (NaN for a rank that ran out of memory before them)."""
    save_failed: bool
    """Rank 0's last checkpoint save failed: every rank stops."""
    stop: bool
    """Some rank received SIGTERM: every rank stops after this step."""

    @property
    def clean(self) -> bool:
        """Every rank has good gradients to average."""
        return not (self.oom_ranks or self.nonfinite_ranks or self.save_failed)


def agree_local(
    *,
    oom: bool,
    nonfinite: Tensor | bool,
    losses: Tensor | None,
    n_tasks: int,
    save_failed: bool,
    stop: bool,
    rank: int,
    world_size: int,
    device: torch.device,
    exchange_rows: Callable[[Tensor, int, int], list[list[float]]] = exchange,
) -> LocalVerdict:
    """Point 1: join the status exchange after the local work. Exactly once per step.

    ``nonfinite`` may stay a device tensor: the exchange is the step's one host sync.
    ``exchange_rows``: the collective that carries the rows (``GradBuffer.exchange``
    carries the gradients too).
    """
    row = torch.zeros(status_length(n_tasks), dtype=torch.float64, device=device)
    row[0], row[2], row[3] = float(oom), float(save_failed), float(stop)
    row[1] = nonfinite.to(row.dtype) if isinstance(nonfinite, Tensor) else float(nonfinite)
    if losses is not None:
        row[4:] = losses.detach().to(row.dtype)
    else:
        row[4:] = math.nan
    table = exchange_rows(row, rank, world_size)
    return LocalVerdict(
        oom_ranks=tuple(r for r in range(world_size) if table[r][0] > 0),
        nonfinite_ranks=tuple(r for r in range(world_size) if table[r][1] > 0),
        losses=tuple(tuple(table[r][4:]) for r in range(world_size)),
        save_failed=any(table[r][2] > 0 for r in range(world_size)),
        stop=any(table[r][3] > 0 for r in range(world_size)),
    )


class Update(enum.IntEnum):
    """How one rank's update (unpack, clip, optimizer step, scheduler) went."""

    DONE = 0
    OOM_BEFORE_STEP = 1
    """Out of memory before the optimizer touched any state: only gradients are lost."""
    OOM_IN_STEP = 2
    """Out of memory inside the optimizer step or scheduler: parameters may be half-updated."""


@dataclass(frozen=True, slots=True)
class UpdateVerdict:
    """What every rank agreed on after the update."""

    status: tuple[Update, ...]
    """Each rank's :class:`Update`."""

    def ranks(self, *kinds: Update) -> list[int]:
        return [r for r, s in enumerate(self.status) if s in kinds]

    @property
    def applied(self) -> bool:
        return all(s is Update.DONE for s in self.status)

    @property
    def source(self) -> int | None:
        """The lowest rank whose update completed (copied to the others after a partial OOM)."""
        done = self.ranks(Update.DONE)
        return done[0] if done else None


def agree_update(
    status: Update, *, rank: int, world_size: int, device: torch.device
) -> UpdateVerdict:
    """Point 2: join the status exchange after the update. Exactly once per step."""
    row = torch.tensor([float(status)], dtype=torch.float64, device=device)
    table = exchange(row, rank, world_size)
    return UpdateVerdict(status=tuple(Update(int(r[0])) for r in table))


def broadcast_replica(params: Sequence[Tensor], optimizer: torch.optim.Optimizer, src: int) -> None:
    """Copy ``src``'s parameters and optimizer state into every rank's, in place.

    Used after an out-of-memory inside the optimizer step on some ranks: their update is
    in an unknown state, ``src``'s completed. In place, so the rank short of memory
    needs none. Every rank holds the same state keys (pre-allocated at start).
    """
    for p in params:
        dist.broadcast(p.data, src=src)
        state = optimizer.state[p]
        for key in sorted(state):
            value = state[key]
            if not isinstance(value, Tensor):
                continue
            if value.device == p.device:
                dist.broadcast(value, src=src)
            else:  # AdamW keeps its step counter on the CPU, which NCCL cannot send
                staged = value.to(p.device)
                dist.broadcast(staged, src=src)
                value.copy_(staged)


def heartbeat(rank: int, step: int) -> None:
    """Record in the rendezvous store the step this rank has reached (read after a hang)."""
    store = dist.distributed_c10d._get_default_store()
    store.set(_HEARTBEAT.format(rank=rank), str(step))


def publish_whereabouts(rank: int) -> None:
    """Record this rank's host and pid, so a peer that sees it hang can ask for its stack."""
    store = dist.distributed_c10d._get_default_store()
    store.set(_WHERE.format(rank=rank), f"{socket.gethostname()} {os.getpid()}")


def whereabouts(rank: int) -> tuple[str, int] | None:
    """``(host, pid)`` that ``rank`` published, or None when unknown."""
    try:
        store = dist.distributed_c10d._get_default_store()
        key = _WHERE.format(rank=rank)
        if not store.check([key]):
            return None
        host, pid = store.get(key).decode().split()
        return host, int(pid)
    except (RuntimeError, ValueError):
        return None


def publish_failure(rank: int, text: str) -> None:
    """Record why this rank is exiting outside any agreement (best effort), so a peer whose
    collective then fails can name the rank and the cause instead of "a peer died"."""
    with contextlib.suppress(RuntimeError, ValueError):
        dist.distributed_c10d._get_default_store().set(_FAILED.format(rank=rank), text)


def published_failures(world_size: int) -> dict[int, str]:
    """``{rank: text}`` of every rank that published a failure (empty when unknown)."""
    found = {}
    try:
        store = dist.distributed_c10d._get_default_store()
        for rank in range(world_size):
            key = _FAILED.format(rank=rank)
            if store.check([key]):
                found[rank] = store.get(key).decode()
    except (RuntimeError, ValueError):
        pass
    return found


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
