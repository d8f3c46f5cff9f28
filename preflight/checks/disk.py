"""Free disk where the run writes checkpoints, logs and caches."""

from __future__ import annotations

import shutil
from pathlib import Path

from preflight.options import Context
from preflight.result import CheckResult, Status
from preflight.units import GiB, human_bytes

MIN_FREE = 2 * GiB
"""Below this a run fails at its first checkpoints; fail."""
WARN_FREE = 10 * GiB
"""Below this a long run with several kept checkpoints may run out; warn."""


def _existing(path: Path) -> Path:
    """The path itself or its nearest existing parent (the run may not have created it yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def run(ctx: Context) -> CheckResult:
    targets = {"output_dir": Path("runs"), "cache_dir": Path("cache")}
    if ctx.cfg is not None:
        targets = {"output_dir": ctx.cfg.run.output_dir, "cache_dir": ctx.cfg.cache.dir}
    free_by_target: dict[str, int] = {}
    for role, target in targets.items():
        free_by_target[role] = shutil.disk_usage(_existing(target)).free
    role, free = min(free_by_target.items(), key=lambda kv: kv[1])
    where = f"{targets[role]} ({role})"
    if free < MIN_FREE:
        status, msg = Status.FAIL, f"only {human_bytes(free)} free at {where}"
    elif free < WARN_FREE:
        status, msg = Status.WARN, f"{human_bytes(free)} free at {where}; a long run may fill it"
    else:
        status, msg = Status.PASS, f"{human_bytes(free)} free at {where}"
    return CheckResult(
        name="disk",
        status=status,
        message=msg,
        value=round(free / GiB, 2),
        threshold=round(MIN_FREE / GiB, 2),
        unit="GiB",
        hint=None
        if status is Status.PASS
        else (
            "free space (old runs: du -sh runs/*), lower checkpoint.keep_last, or point "
            "run.output_dir at a bigger disk (on Vast.ai disk size is fixed at creation)"
        ),
        details={k: {"path": str(targets[k]), "free_bytes": v} for k, v in free_by_target.items()},
    )
