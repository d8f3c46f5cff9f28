"""Distributed env: under torchrun, RANK/WORLD_SIZE/LOCAL_* and MASTER_* agree.

Uses the trainer's own reader (``ups.distributed.env.read_dist_env``), so the rules are the same.
"""

from __future__ import annotations

from ups.distributed.env import read_dist_env
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

HINT = "start workers with `ups launch` (or torchrun), which set these variables together"


def run(ctx: Context) -> CheckResult:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    seen = {k: ctx.env[k] for k in keys if k in ctx.env}
    try:
        env = read_dist_env(ctx.env)
    except ValueError as exc:
        return CheckResult(
            name="distenv",
            status=Status.FAIL,
            message=str(exc).split(". Start")[0],
            hint=HINT,
            details={"env": seen},
        )
    if not env.under_torchrun:
        partial = sorted(seen)
        if partial and ("RANK" in seen or "WORLD_SIZE" in seen):
            return CheckResult(
                name="distenv",
                status=Status.FAIL,
                message=f"only some torchrun variables are set: {', '.join(partial)}",
                hint=HINT + "; or unset them for a single-process run",
                details={"env": seen},
            )
        return CheckResult(
            name="distenv",
            status=Status.PASS,
            message="not under torchrun (plain process); nothing to check",
            details={"env": seen},
        )
    nproc = ctx.nproc_per_node
    if nproc is not None and env.local_world_size != nproc:
        return CheckResult(
            name="distenv",
            status=Status.FAIL,
            message=f"LOCAL_WORLD_SIZE={env.local_world_size} but nproc_per_node is {nproc}",
            value=env.local_world_size,
            threshold=nproc,
            hint=HINT,
            details={"env": seen},
        )
    return CheckResult(
        name="distenv",
        status=Status.PASS,
        message=f"rank {env.rank} of {env.world_size} (local {env.local_rank} of "
        f"{env.local_world_size}), master {env.master_addr}:{env.master_port}",
        value=env.world_size,
        details={"env": seen},
    )
