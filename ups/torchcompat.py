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


FSDP_RESET = "FSDPModule.reset_iter_state"
FSDP_RESET_SINCE = "2.13"
"""The first release with it (checked in the wheels of 2.11, 2.12 and 2.13)."""


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
    "ddp_no_forward_buffer_sync",
    "fsdp_missing",
    "in_supported_range",
    "release",
    "supported_range_text",
]
