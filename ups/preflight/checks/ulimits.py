"""ulimits: open files for DataLoader workers; memlock and stack as NVIDIA advises for GPUs."""

from __future__ import annotations

import resource
from pathlib import Path

from ups.console.units import MiB, human_bytes
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status, worst

MIN_NOFILE = 4096
"""Below this, DataLoader workers sharing tensors by file descriptor hit "Too many open files"."""
MIN_STACK = 64 * MiB
"""NVIDIA's PyTorch container advice: ``--ulimit stack=67108864``."""
COMPOSE_HINT = (
    "compose `ulimits: {memlock: -1, stack: 67108864, nofile: 1048576}` or "
    "`docker run --ulimit memlock=-1 --ulimit stack=67108864 --ulimit nofile=1048576:1048576`"
)


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def gpu_host() -> bool:
    """Whether NVIDIA device nodes exist (cheap; no CUDA or NVML initialised)."""
    return Path("/dev/nvidiactl").exists()


def run(ctx: Context) -> CheckResult:
    nofile, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    memlock, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    gpus = gpu_host()
    problems: list[tuple[Status, str]] = []
    if nofile != resource.RLIM_INFINITY and nofile < MIN_NOFILE:
        problems.append(
            (Status.WARN, f"nofile {nofile} < {MIN_NOFILE} (raise: ulimit -n {_show(nofile_hard)})")
        )
    if gpus and memlock != resource.RLIM_INFINITY:
        problems.append(
            (
                Status.WARN,
                f"memlock {human_bytes(memlock)} is not unlimited (pinned memory and NCCL need it)",
            )
        )
    if gpus and stack != resource.RLIM_INFINITY and stack < MIN_STACK:
        problems.append((Status.WARN, f"stack {human_bytes(stack)} < 64 MiB"))
    summary = f"nofile={_show(nofile)} memlock={_show(memlock)} stack={_show(stack)}"
    if not gpus:
        summary += " (no GPU: memlock/stack not required)"
    return CheckResult(
        name="ulimits",
        status=worst([s for s, _ in problems]),
        message="; ".join(m for _, m in problems) or summary,
        value=nofile if nofile != resource.RLIM_INFINITY else "unlimited",
        threshold=MIN_NOFILE,
        unit="files",
        hint=COMPOSE_HINT if problems else None,
        details={
            "nofile_soft": _show(nofile),
            "nofile_hard": _show(nofile_hard),
            "memlock": _show(memlock),
            "stack": _show(stack),
            "gpu_host": gpus,
        },
    )
