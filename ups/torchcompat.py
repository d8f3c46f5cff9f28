"""What this torch can do, asked once: the features ups uses that differ between releases.

ups supports torch ``SUPPORTED_TORCH`` (docs/gpu.md, "The torch range"). Inside that range a
feature is chosen by asking for it (a keyword in a signature, an attribute), never by
comparing version strings: a patched or backported build answers for itself. Every caller
asks here; nothing else in ups probes torch's internals for this.

The release range itself is a declaration (``pyproject.toml``'s dependency, which
``tests/test_torch_range.py`` keeps equal to ``SUPPORTED_TORCH``); preflight's ``versions``
check reads it from here.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

SUPPORTED_TORCH = ("2.11", "2.16")
"""The supported torch releases: from the first (inclusive) up to the second (exclusive).
``pyproject.toml`` declares the same as ``torch>=2.11,<2.16``."""


def release(version: str) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``; ``"2.16.0.dev20260101"`` -> ``(2, 16, 0)``: the
    leading numeric parts of a version, for the range check only."""
    parts = []
    for part in version.split("+", 1)[0].split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.group() != part:  # "0rc1", "0a0": the release this pre-release leads to
            break
    return tuple(parts)


def _floor(spec: str) -> tuple[int, ...]:
    return tuple(int(p) for p in spec.split("."))


def in_supported_range(version: str) -> bool:
    """True when ``version`` (``torch.__version__``) lies in :data:`SUPPORTED_TORCH`."""
    low, high = (_floor(s) for s in SUPPORTED_TORCH)
    have = release(version)
    return low <= have[: len(low)] and have[: len(high)] < high


def supported_range_text() -> str:
    """``">=2.11,<2.16"``: the range as pip writes it."""
    low, high = SUPPORTED_TORCH
    return f">={low},<{high}"


@functools.cache
def ddp_no_forward_buffer_sync() -> dict[str, Any]:
    """The ``DistributedDataParallel`` keyword that keeps its forward free of collectives.

    ups agrees between ranks at fixed points only (``ups.distributed.agreement``); DDP's
    default broadcast of buffers at each forward would be a collective inside a step. Newer
    releases call the switch ``forward_sync_buffers``; older ones ``broadcast_buffers``,
    which has the same effect (no buffer collective in forward) and is kept beside it.
    """
    from torch.nn.parallel import DistributedDataParallel

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


SHUTDOWN_TIMEOUT = "--shutdown-timeout"


def torchrun_argv(argv: list[str]) -> tuple[list[str], int | None]:
    """``argv`` for this torch's torchrun parser, and the grace to provide another way.

    ``ups launch`` gives torchrun ``--shutdown-timeout=S``: the seconds between forwarding
    SIGTERM to the workers and SIGKILL, so a final checkpoint can finish. torchrun's parser
    has the option from 2.13 on; before it, the option is taken out of ``argv`` and its
    seconds returned, for :func:`close_workers_within` (torchrun would otherwise kill the
    workers after a fixed 30 s, cutting a slow checkpoint short).
    """
    from torch.distributed.run import get_args_parser

    _, unknown = get_args_parser().parse_known_args(argv)
    found = [a for a in unknown if a.split("=", 1)[0] in (SHUTDOWN_TIMEOUT, "--shutdown_timeout")]
    if not found:
        return argv, None
    kept = list(argv)
    for token in found:
        kept.remove(token)  # its first place: torchrun's options, before the script
    return kept, int(found[-1].split("=", 1)[1])


def close_workers_within(seconds: int) -> None:
    """Make torchrun's worker context wait ``seconds`` after its stop signal before SIGKILL:
    the default of ``PContext.close(death_sig, timeout=30)`` (torch's documented elastic
    multiprocessing API), which the agent's shutdown calls without a timeout before 2.13."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    close = PContext.close

    def close_within(self: Any, death_sig: Any = None, timeout: int = seconds) -> None:
        close(self, death_sig, timeout)

    PContext.close = close_within  # type: ignore[method-assign]


FSDP_RESET = "FSDPModule.reset_iter_state"
FSDP_RESET_SINCE = "2.13"
"""The first release with it (absent from the 2.11 and 2.12 wheels, present in 2.13 and 2.15)."""


def fsdp_missing() -> str | None:
    """What ``training.strategy: fsdp`` needs that this torch lacks, or None.

    ups's FSDP step (``ups.distributed.fsdp``) resets FSDP2's per-iteration state at every
    step's start, so a step that an out-of-memory error cut off mid-forward or mid-backward
    leaves nothing behind; without that reset a skipped step would leave FSDP half-way and
    the next one fail or hang. There is no public way to do it before ``FSDP_RESET``.
    """
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        return "torch.distributed.fsdp.fully_shard (FSDP2)"
    if not hasattr(getattr(fsdp, "FSDPModule", None), "reset_iter_state"):
        return FSDP_RESET
    return None


__all__ = [
    "FSDP_RESET_SINCE",
    "SUPPORTED_TORCH",
    "close_workers_within",
    "ddp_no_forward_buffer_sync",
    "fsdp_missing",
    "in_supported_range",
    "release",
    "supported_range_text",
    "torchrun_argv",
]
