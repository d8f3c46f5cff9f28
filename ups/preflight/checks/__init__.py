"""The checks, one module each, in the order they run.

Each module exposes ``run(ctx: Context) -> CheckResult``. A check's module is imported
only when the check runs, so this table costs nothing to import: ``--only ports`` stays
fast, and ``ups launch`` (which takes its port check from here) never imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ups.preflight.options import Context
from ups.preflight.result import CheckResult


@dataclass(frozen=True, slots=True)
class CheckSpec:
    name: str
    module: str
    """The module under ``ups.preflight.checks`` whose ``run(ctx)`` is the check."""
    timeout_s: float
    """Default deadline; ``--timeout NAME=SECONDS`` overrides it."""
    summary: str
    uses_torch: bool = True
    """Whether the check imports torch. The runner imports it once before the first such
    check's deadline starts: on a fresh host's cold disk the import alone can take longer
    than a check's whole budget."""

    def run(self, ctx: Context) -> CheckResult:
        check = importlib.import_module(f"{__name__}.{self.module}")
        result: CheckResult = check.run(ctx)
        return result


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("gpu", "gpu", 30.0, "GPU count vs torch/NVML/CUDA_VISIBLE_DEVICES, memory, ECC"),
    CheckSpec("versions", "versions", 30.0, "torch/CUDA/cuDNN/NCCL/python vs pins.toml"),
    CheckSpec("ports", "ports", 10.0, "master and rendezvous ports bindable", uses_torch=False),
    CheckSpec("shm", "shm", 10.0, "/dev/shm size for DataLoader workers and NCCL"),
    CheckSpec("ulimits", "ulimits", 5.0, "nofile, memlock, stack limits", uses_torch=False),
    # 60 s: the estimate builds the model on the meta device, whose first use imports
    # torch's compiler stack (~1.5 s CPU; 15 s wall on a saturated 2-core host).
    CheckSpec("disk", "disk", 60.0, "free disk vs what the run will write (checkpoints, logs)"),
    CheckSpec("memory", "memory", 5.0, "free RAM (and the cgroup limit)", uses_torch=False),
    CheckSpec(
        "distenv", "distenv", 5.0, "RANK/WORLD_SIZE/... consistent under torchrun", uses_torch=False
    ),
    CheckSpec(
        "wandb",
        "wandb_creds",
        5.0,
        "W&B mode and whether credentials are present",
        uses_torch=False,
    ),
    CheckSpec("data", "data", 60.0, "every HDF5 file opens with the expected keys and shapes"),
    CheckSpec("cache", "cache", 60.0, "cached .pt files hold CPU tensors only"),
    CheckSpec("allreduce", "allreduce", 90.0, "all-reduce correctness and bus bandwidth"),
)

GROUPS: dict[str, tuple[str, ...]] = {
    "system": ("shm", "ulimits", "disk", "memory"),
    "env": ("distenv", "wandb"),
}
"""Names that select several checks in ``--only``/``--skip``."""

__all__ = ["CHECKS", "GROUPS", "CheckSpec"]
