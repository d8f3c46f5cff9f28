"""The registry of strategies (``training.strategy``): the one place that picks DDP or FSDP2.

:mod:`ups.train.strategy` holds what both implement (and DDP's); FSDP's lives in
:mod:`ups.train.strategy_fsdp`, imported only when a run asks for it.
"""

from __future__ import annotations

import torch

from ups.config.schema import TrainingConfig
from ups.distributed.env import DistEnv
from ups.model import LatentOperator
from ups.train.strategy import DDPStrategy, Strategy


def make_strategy(
    training: TrainingConfig, model: LatentOperator, device: torch.device, env: DistEnv
) -> Strategy:
    """The strategy ``training.strategy`` names, wrapping ``model`` (already on ``device``)."""
    if training.strategy == "fsdp":
        # Only here: FSDP and torch.distributed.checkpoint take about 1 s of CPU to import,
        # which every DDP worker would otherwise pay.
        from ups.train.strategy_fsdp import FSDPStrategy

        return FSDPStrategy(model, device, env)
    return DDPStrategy(model, device, env, bucket_view=training.oom_policy == "fail")
