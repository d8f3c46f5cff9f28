"""/dev/shm: Docker's default 64 MB breaks NCCL and DataLoader workers (REFERENCE §1)."""

from __future__ import annotations

import os

from preflight.options import Context
from preflight.result import CheckResult, Status
from preflight.units import GiB, MiB, human_bytes

PER_RANK = 256 * MiB
"""NCCL's shared-memory transport buffers and torch's IPC per training process."""
PER_WORKER = 512 * MiB
"""Batches that DataLoader workers hand to their rank through shared memory."""
FLOOR = 1 * GiB

HINT = (
    "give the container more shared memory: compose `ipc: host` (or `shm_size: 16gb`), "
    "`docker run --ipc=host`; on Vast.ai /dev/shm grows with the GPU share rented"
)


def required_bytes(nproc: int, num_workers: int) -> int:
    """Shared memory a node needs: per rank for NCCL plus per DataLoader worker, at least 1 GiB."""
    return max(FLOOR, nproc * (PER_RANK + num_workers * PER_WORKER))


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
    workers = ctx.cfg.training.num_workers if ctx.cfg else 0
    need = required_bytes(nproc, workers)
    details = {
        "path": str(path),
        "total_bytes": total,
        "free_bytes": free,
        "required_bytes": need,
        "nproc": nproc,
        "num_workers": workers,
    }
    basis = f"{nproc} ranks x {workers} DataLoader workers"
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
