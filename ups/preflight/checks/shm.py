"""/dev/shm: Docker's default 64 MB breaks NCCL and DataLoader workers."""

from __future__ import annotations

import os

from ups.config import Config
from ups.console.units import GiB, MiB, human_bytes
from ups.data.loader import loader_shm_bytes, step_batch_bytes
from ups.data.pdebench import DataError, inspect_task
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

PER_RANK = 256 * MiB
"""NCCL's shared-memory transport buffers and torch's IPC per training process."""
PER_WORKER = 512 * MiB
"""Assumed per DataLoader worker when the data files cannot be read to size the batches."""
FLOOR = 1 * GiB

HINT = (
    "give the container more shared memory: compose `ipc: host` (or `shm_size: 16gb`), "
    "`docker run --ipc=host`; on Vast.ai /dev/shm grows with the GPU share rented; or "
    "lower training.num_workers or training.prefetch_factor"
)


def required_bytes(nproc: int, loader_bytes: int) -> int:
    """Shared memory a node needs: per rank NCCL's share plus what its DataLoader workers
    hand over (``ups.data.loader.loader_shm_bytes``), at least 1 GiB."""
    return max(FLOOR, nproc * (PER_RANK + loader_bytes))


def _loader_bytes(cfg: Config | None) -> tuple[int, str]:
    """Per rank: the batches in flight from this config's workers, and how that was sized."""
    if cfg is None or cfg.training.num_workers == 0:
        return 0, "no DataLoader workers"
    t = cfg.training
    try:
        infos = {task.name: inspect_task(task) for task in cfg.tasks}
    except DataError:
        # The data check names the problem; size the workers by a generous constant.
        return t.num_workers * PER_WORKER, f"{t.num_workers} DataLoader workers (data unread)"
    per_rank = loader_shm_bytes(infos, t.batch_size, t.num_workers, t.prefetch_factor)
    batch = step_batch_bytes(infos, t.batch_size)
    return per_rank, (
        f"{t.num_workers} DataLoader workers x prefetch_factor {t.prefetch_factor} "
        f"(+2) steps of {human_bytes(batch)}"
    )


def run(ctx: Context) -> CheckResult:
    path = ctx.opts.shm_path
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return CheckResult(
            name="shm",
            status=Status.FAIL,
            message=f"cannot stat {path}: {exc.strerror}",
            hint=HINT,
        )
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    nproc = ctx.nproc_per_node or 2
    loader, sized = _loader_bytes(ctx.cfg)
    need = required_bytes(nproc, loader)
    details = {
        "path": str(path),
        "total_bytes": total,
        "free_bytes": free,
        "required_bytes": need,
        "nproc": nproc,
        "num_workers": ctx.cfg.training.num_workers if ctx.cfg else 0,
        "loader_bytes_per_rank": loader,
    }
    basis = f"{nproc} ranks, each 256 MiB + {sized}"
    if total < need:
        status, msg = (
            Status.FAIL,
            (f"{path} is {human_bytes(total)}, below the {human_bytes(need)} needed for {basis}"),
        )
    elif free < need:
        status, msg = (
            Status.WARN,
            (
                f"{path} has {human_bytes(free)} free of {human_bytes(total)}; {basis} need "
                f"{human_bytes(need)} (stale segments from an earlier run?)"
            ),
        )
    else:
        status, msg = (
            Status.PASS,
            f"{path} has {human_bytes(free)} free ({basis} need {human_bytes(need)})",
        )
    return CheckResult(
        name="shm",
        status=status,
        message=msg,
        value=round(free / GiB, 3),
        threshold=round(need / GiB, 3),
        unit="GiB",
        hint=None
        if status is Status.PASS
        else (HINT if status is Status.FAIL else f"remove stale files: ls -la {path}"),
        details=details,
    )
