"""The checks, one module each, in the order they run.

Each module exposes ``run(ctx: Context) -> CheckResult``; torch and other heavy imports
happen inside ``run`` so ``--only ports`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ups.preflight.checks import (
    allreduce,
    cache,
    data,
    disk,
    distenv,
    gpu,
    memory,
    ports,
    shm,
    ulimits,
    versions,
    wandb_creds,
)
from ups.preflight.options import Context
from ups.preflight.result import CheckResult


@dataclass(frozen=True, slots=True)
class CheckSpec:
    name: str
    run: Callable[[Context], CheckResult]
    timeout_s: float
    """Default deadline; ``--timeout NAME=SECONDS`` overrides it."""
    summary: str


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("gpu", gpu.run, 30.0, "GPU count vs torch/NVML/CUDA_VISIBLE_DEVICES, memory, ECC"),
    CheckSpec("versions", versions.run, 30.0, "torch/CUDA/cuDNN/NCCL/python vs pins.toml"),
    CheckSpec("ports", ports.run, 10.0, "master and rendezvous ports bindable"),
    CheckSpec("shm", shm.run, 10.0, "/dev/shm size for DataLoader workers and NCCL"),
    CheckSpec("ulimits", ulimits.run, 5.0, "nofile, memlock, stack limits"),
    # 60 s: the estimate builds the model on the meta device, whose first use imports
    # torch's compiler stack (~1.5 s CPU; 15 s wall on a saturated 2-core host).
    CheckSpec("disk", disk.run, 60.0, "free disk vs what the run will write (checkpoints, logs)"),
    CheckSpec("memory", memory.run, 5.0, "free RAM (and the cgroup limit)"),
    CheckSpec("distenv", distenv.run, 5.0, "RANK/WORLD_SIZE/... consistent under torchrun"),
    CheckSpec("wandb", wandb_creds.run, 5.0, "W&B mode and whether credentials are present"),
    CheckSpec("data", data.run, 60.0, "every HDF5 file opens with the expected keys and shapes"),
    CheckSpec("cache", cache.run, 60.0, "cached .pt files hold CPU tensors only"),
    CheckSpec("allreduce", allreduce.run, 90.0, "all-reduce correctness and bus bandwidth"),
)

GROUPS: dict[str, tuple[str, ...]] = {
    "system": ("shm", "ulimits", "disk", "memory"),
    "env": ("distenv", "wandb"),
}
"""Names that select several checks in ``--only``/``--skip``."""

__all__ = [
    "CHECKS",
    "GROUPS",
    "CheckSpec",
    "allreduce",
    "cache",
    "data",
    "disk",
    "distenv",
    "gpu",
    "memory",
    "ports",
    "shm",
    "ulimits",
    "versions",
    "wandb_creds",
]
