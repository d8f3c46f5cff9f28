"""How the model is spread over the ranks (``training.strategy``): DDP replicas or FSDP2 shards.

The training loop (``ups.train.loop``) is one loop for both, with its two agreements at
the same points; a strategy supplies only what differs: the wrapper, what happens at the
start of a step, where local gradients go and how they are reduced, clipping, what an
out-of-memory error inside the update leaves behind, and the checkpoint format.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ups.distributed.agreement import broadcast_replica
from ups.distributed.env import DistEnv
from ups.distributed.gradbuf import GradBuffer
from ups.model import LatentOperator
from ups.torchcompat import ddp_no_forward_buffer_sync
from ups.train.checkpoint import latest_good_checkpoint, save_checkpoint


class Grads(Protocol):
    """Where a step's gradients go and how they are reduced (``GradBuffer`` for DDP under
    ``oom_policy: skip``, ``ShardedGrads`` for FSDP)."""

    def attach(self) -> None:
        """At the start of a step, before the backward."""

    def nonfinite(self) -> Tensor:
        """After the local backward: a 0-d bool tensor, True when a gradient is NaN/inf."""

    def exchange(self, row: Tensor, rank: int, world_size: int) -> list[list[float]]:
        """Point 1 of the step: every rank's status row as a table (``GradBuffer`` sums the
        gradients in the same collective; ``ShardedGrads`` after it)."""

    def average(self, world_size: int) -> None:
        """After point 1, only when every rank is clean: the averaged gradients."""

    def zero(self) -> None:
        """After the step: clear the gradients for the next one."""


class Strategy(Protocol):
    name: Literal["ddp", "fsdp"]
    model: nn.Module
    """What the loop calls forward on."""

    def begin_step(self) -> None:
        """Every rank, every step, before any work that may fail."""

    def local_backward(self) -> AbstractContextManager[None]:
        """Forward and backward inside this run no collective."""

    def grad_buffer(self, params: Sequence[Tensor], status_len: int) -> Grads:
        """Where the step's gradients go; ``status_len``: the size of point 1's status table."""

    def clip(self, params: Sequence[Tensor], max_norm: float) -> None: ...
    def repair(
        self, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, source: int, step: int
    ) -> None:
        """Make every rank's state equal ``source``'s after an update failed on others."""

    def model_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The ``model`` and ``optimizer`` entries of a checkpoint."""

    def save(self, directory: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
        """Write a checkpoint (called on the ranks in ``saves_on``)."""

    def saves_on(self, rank: int) -> bool: ...
    def latest_good(self, directory: Path) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0: the newest checkpoint of this strategy's format that verifies."""

    def load(self, path: Path, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Every rank: restore model and optimizer from ``path`` (``state``: what rank 0 read)."""

    def for_eval(self) -> LatentOperator:
        """Every rank: the model to evaluate, with no collective left in its forward."""

    def weights(self) -> dict[str, Tensor]:
        """Every rank: the full model weights (a collective under FSDP)."""


class DDPStrategy:
    """Replicas: gradients stay local under ``no_sync`` until the agreement."""

    name: Literal["ddp", "fsdp"] = "ddp"

    def __init__(
        self, model: LatentOperator, device: torch.device, env: DistEnv, *, bucket_view: bool
    ) -> None:
        self.module, self.env = model, env
        self.ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            **ddp_no_forward_buffer_sync(),  # no collective in forward: ups.distributed.agreement
            # oom_policy fail: DDP's buckets hold the gradients (no copy in and out of them);
            # skip: the trainer's GradBuffer does, and DDP never syncs (no_sync).
            gradient_as_bucket_view=bucket_view,
        )
        self.model: nn.Module = self.ddp

    def begin_step(self) -> None:
        pass

    def local_backward(self) -> AbstractContextManager[None]:
        return self.ddp.no_sync()

    def grad_buffer(self, params: Sequence[Tensor], status_len: int) -> Grads:
        return GradBuffer(params, status_len)

    def clip(self, params: Sequence[Tensor], max_norm: float) -> None:
        nn.utils.clip_grad_norm_(params, max_norm)

    def repair(
        self, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, source: int, step: int
    ) -> None:
        broadcast_replica(params, optimizer, source)

    def model_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "optimizer": optimizer.state_dict()}

    def saves_on(self, rank: int) -> bool:
        return rank == 0

    def save(self, directory: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
        return save_checkpoint(directory, step, state, keep_last)

    def latest_good(self, directory: Path) -> tuple[Path, dict[str, Any]] | None:
        return latest_good_checkpoint(directory)

    def load(self, path: Path, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        self.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def for_eval(self) -> LatentOperator:
        return self.module

    def weights(self) -> dict[str, Tensor]:
        return self.module.state_dict()
