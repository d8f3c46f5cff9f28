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
    func: str = "run"
    """The function of ``module`` that is the check (one module can hold several rows)."""
    burn_in: bool = False
    """A burn-in row: runs only when the burn-in is on (``preflight.burn_in``)."""

    def run(self, ctx: Context) -> CheckResult:
        check = importlib.import_module(f"{__name__}.{self.module}")
        result: CheckResult = getattr(check, self.func)(ctx)
        return result


def _burn_in(name: str, timeout_s: float, summary: str) -> CheckSpec:
    return CheckSpec(name, "burnin", timeout_s, summary, func=name, burn_in=True)


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
    # The burn-in (preflight.burn_in / --burn-in): each a timed loop of a fixed budget.
    _burn_in("matmul", 30.0, "burn-in: matmul TFLOP/s in the run's precision vs known-good"),
    _burn_in("h2d", 30.0, "burn-in: host-to-device copy GB/s (CUDA)"),
    _burn_in("disk_write", 60.0, "burn-in: disk write MB/s in the run directory"),
    _burn_in("disk_read", 60.0, "burn-in: disk read MB/s in the run directory"),
    _burn_in("loader", 60.0, "burn-in: data loader samples/s on the run's data"),
    _burn_in("step", 60.0, "burn-in: samples/s of warm steps of the run's model and batch"),
)

GROUPS: dict[str, tuple[str, ...]] = {
    "system": ("shm", "ulimits", "disk", "memory"),
    "env": ("distenv", "wandb"),
    "burnin": ("matmul", "h2d", "disk_write", "disk_read", "loader", "step"),
}
"""Names that select several checks in ``--only``/``--skip``."""

__all__ = ["CHECKS", "GROUPS", "CheckSpec"]
