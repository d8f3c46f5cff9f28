"""The FSDP2 strategy (``training.strategy: fsdp``); see :mod:`ups.train.strategy`.

Its own module, imported only for an FSDP run: FSDP and ``torch.distributed.checkpoint``
cost about 1 s of CPU to import, which a DDP worker does not need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from ups.distributed.env import DistEnv
from ups.distributed.fsdp import ShardedGrads, StepGather, shard_model
from ups.model import LatentOperator
from ups.outcome import EXIT_FAILED
from ups.train.failures import RunFailed
from ups.train.sharded import latest_good_sharded, load_shards, save_sharded
from ups.train.strategy import Grads


class FSDPStrategy:
    """Shards (``ups.distributed.fsdp``): one all-gather at the start of every step, the
    gradient all-reduce after the agreement, sharded checkpoints (``ups.train.sharded``)."""

    name: Literal["ddp", "fsdp"] = "fsdp"

    def __init__(self, model: LatentOperator, device: torch.device, env: DistEnv) -> None:
        self.env = env
        self.sharded = shard_model(model, device, env.world_size)
        self.model: nn.Module = cast(nn.Module, self.sharded)
        self.gather = StepGather(self.sharded)
        self.grads: ShardedGrads | None = None

    def begin_step(self) -> None:
        self.gather.begin_step()

    def local_backward(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # gradient sync is off for good (shard_model)

    def grad_buffer(self, params: Sequence[Tensor], status_len: int) -> Grads:
        self.grads = ShardedGrads(self.sharded, self.env.rank, self.env.world_size)
        return self.grads

    def clip(self, params: Sequence[Tensor], max_norm: float) -> None:
        assert self.grads is not None
        self.grads.clip_(max_norm)

    def repair(
        self, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, source: int, step: int
    ) -> None:
        # Each rank updates only its own shard: no peer holds a copy to repair it from.
        raise RunFailed(
            f"out of memory in the update at step {step} on some ranks while the others "
            "completed it: under training.strategy=fsdp each rank holds the only copy of its "
            "shard of the parameters and optimizer state, so the model is now partly updated. "
            "Lower training.batch_size or the model size, then run the same command again "
            "to resume from the last checkpoint",
            exit_code=EXIT_FAILED,
            cause="oom_in_step",
            failed_rank=None,
        )

    def model_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        self.sharded.reshard()  # local; after a skipped step the gathered copy is in place
        model_sd, optim_sd = get_state_dict(self.model, optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def saves_on(self, rank: int) -> bool:
        return True

    def save(self, directory: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
        shards = {key: state[key] for key in ("model", "optimizer")}
        meta = {key: value for key, value in state.items() if key not in shards}
        return save_sharded(directory, step, shards, meta, keep_last, is_rank0=self.env.is_rank0)

    def latest_good(self, directory: Path) -> tuple[Path, dict[str, Any]] | None:
        return latest_good_sharded(directory)

    def load(self, path: Path, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        shards = self.model_state(optimizer)
        load_shards(path, shards)
        set_state_dict(
            self.model,
            optimizer,
            model_state_dict=shards["model"],
            optim_state_dict=shards["optimizer"],
        )

    def for_eval(self) -> LatentOperator:
        self.gather.begin_step()
        return cast(LatentOperator, self.sharded)

    def weights(self) -> dict[str, Tensor]:
        self.sharded.reshard()
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return cast(dict[str, Tensor], full)
