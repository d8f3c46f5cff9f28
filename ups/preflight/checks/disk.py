"""Free disk where the run writes checkpoints, logs and caches, against what it will write.

The estimate: one checkpoint is the model's state (parameters, buffers) plus AdamW's
two moments (about 3x the parameter bytes, plus a little pickling overhead);
``checkpoint.keep_last`` of them are kept and one more is being written before the
oldest is pruned; logs add about ``LOG_BYTES_PER_STEP`` per rank per step. The model is
built to count its tensors: on the CPU when it is small, else on the meta device, so no
parameter memory is allocated for a big one.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ups.config import Config
from ups.console.units import GiB, human_bytes
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

MIN_FREE = 2 * GiB
"""Below this a run fails at its first checkpoints; fail (also the floor of the estimate)."""
WARN_FREE = 10 * GiB
"""Below this a long run with several kept checkpoints may run out; warn."""
LOG_BYTES_PER_STEP = 2048
"""Per rank per step: the rank's JSON log line(s) and W&B's offline record, generously."""
CHECKPOINT_OVERHEAD = 1.05
"""Pickle headers and the small state (scheduler, step counters, RNG) around the tensors."""
CPU_BUILD_ELEMENTS = 1 << 24
"""A model is built on the CPU (milliseconds) while the tensors made so far hold at most
this many elements (64 MiB of fp32); past that it is built again on the meta device,
whose first random fill imports torch's compiler stack: about 1 s, far more on a busy host."""

if TYPE_CHECKING:
    from torch import nn

    from ups.model import TaskShape


class _TooBig(Exception):
    pass


def build_for_counting(
    shapes: list[TaskShape], cfg: Config, cpu_elements: int = CPU_BUILD_ELEMENTS
) -> nn.Module:
    """The run's model with the right tensor sizes (values are not the run's own)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from ups.model import build_model

    class Budget(TorchFunctionMode):
        """Stops the build once its tensors exceed ``cpu_elements``: a big tensor is only
        allocated by then (``torch.empty``), not yet written, so that costs nothing."""

        def __init__(self) -> None:
            super().__init__()
            self.elements = 0

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                self.elements += out.numel()
                if self.elements > cpu_elements:
                    raise _TooBig
            return out

    try:
        with torch.random.fork_rng(devices=[]), Budget():  # leave this process's RNG as it was
            return build_model(shapes, cfg.model)
    except _TooBig:
        with torch.device("meta"):
            return build_model(shapes, cfg.model)


def _existing(path: Path) -> Path:
    """The path itself or its nearest existing parent (the run may not have created it yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def estimate_run_bytes(cfg: Config, world_size: int) -> dict[str, int]:
    """What the run will write under ``run.output_dir``; raises ValueError/DataError."""
    # The data and the model only here, when the check runs (ups.preflight.checks: importing
    # the checks must stay cheap, since launch imports the ports check for its port).
    from ups.data.pdebench import PDEBenchDataset, inspect_task
    from ups.model import task_shapes

    infos = {t.name: inspect_task(t) for t in cfg.tasks}
    model = build_for_counting(task_shapes(infos), cfg)
    param_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    checkpoint = int((param_bytes + 2 * trainable) * CHECKPOINT_OVERHEAD)
    steps = cfg.training.max_steps
    if steps is None:
        per_rank_batch = cfg.training.batch_size * cfg.training.accum_steps * world_size
        per_epoch = max(
            math.ceil(len(PDEBenchDataset(t, "train", infos[t.name])) / per_rank_batch)
            for t in cfg.tasks
        )
        steps = cfg.training.epochs * max(per_epoch, 1)
    logs = LOG_BYTES_PER_STEP * steps * world_size
    total = checkpoint * (cfg.checkpoint.keep_last + 1) + logs
    return {"checkpoint_bytes": checkpoint, "log_bytes": logs, "steps": steps, "total": total}


def run(ctx: Context) -> CheckResult:
    from ups.data.pdebench import DataError

    targets = {"output_dir": Path("runs"), "cache_dir": Path("cache")}
    if ctx.cfg is not None:
        targets = {"output_dir": ctx.cfg.run.output_dir, "cache_dir": ctx.cfg.cache.dir}
    need = dict.fromkeys(targets, MIN_FREE)
    estimate: dict[str, int] | None = None
    if ctx.cfg is not None:
        world = ctx.opts.nproc_per_node or ctx.cfg.distributed.nproc_per_node or 1
        try:
            estimate = estimate_run_bytes(ctx.cfg, world)
            need["output_dir"] = max(MIN_FREE, estimate["total"])
        except (ValueError, OSError, DataError):  # the data and config checks say why
            estimate = None
    free_by_target = {role: shutil.disk_usage(_existing(t)).free for role, t in targets.items()}
    role = min(targets, key=lambda r: free_by_target[r] - need[r])
    free, required = free_by_target[role], need[role]
    where = f"{targets[role]} ({role})"
    wants = ""
    if role == "output_dir" and ctx.cfg is not None and estimate is not None:
        wants = (
            f"; the run will write about {human_bytes(estimate['total'])} "
            f"({ctx.cfg.checkpoint.keep_last + 1} x {human_bytes(estimate['checkpoint_bytes'])}"
            f" checkpoints + {human_bytes(estimate['log_bytes'])} logs)"
        )
    if free < required:
        status = Status.FAIL
        msg = f"only {human_bytes(free)} free at {where}, {human_bytes(required)} needed{wants}"
    elif free < max(WARN_FREE, 2 * required):
        status, msg = Status.WARN, f"{human_bytes(free)} free at {where}; a long run may fill it"
    else:
        status, msg = Status.PASS, f"{human_bytes(free)} free at {where}{wants}"
    return CheckResult(
        name="disk",
        status=status,
        message=msg,
        value=round(free / GiB, 2),
        threshold=round(required / GiB, 2),
        unit="GiB",
        hint=None
        if status is Status.PASS
        else (
            "free space (old runs: du -sh runs/*), lower checkpoint.keep_last, or point "
            "run.output_dir at a bigger disk (on Vast.ai disk size is fixed at creation)"
        ),
        details={
            **{
                k: {"path": str(targets[k]), "free_bytes": v, "required_bytes": need[k]}
                for k, v in free_by_target.items()
            },
            "estimate": estimate,
        },
    )
