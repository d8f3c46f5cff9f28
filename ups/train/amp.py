"""Mixed precision: autocast for the forward, and fp16's loss scaler driven by the agreement.

``bf16`` needs no scaler (its exponent range is fp32's). ``fp16`` (CUDA only) does: the
loss is multiplied by a scale before backward, and a step whose scaled gradients overflow
is skipped and the scale halved. ups needs no second mechanism for that overflow check:
the per-step non-finite flag (``GradBuffer.pack`` / the averaged gradients under
``oom_policy: fail``) already sees the scaled gradients, and every rank learns every
rank's flag at the agreement. :func:`scaler_overflow` feeds that agreed verdict to the
``GradScaler`` so it backs off identically on every rank, and a clean step goes through
the scaler's own ``unscale_``/``step``/``update``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

Precision = str
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """``torch.autocast`` to the configured dtype; nothing for fp32."""
    dtype = _DTYPES.get(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaler; None for fp32 and bf16."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def is_overflow(
    scaler: torch.amp.GradScaler | None,
    nonfinite_ranks: Sequence[int],
    losses: Sequence[Sequence[float]],
) -> bool:
    """An agreed non-finite step that is fp16 overflow: gradients only, every loss finite.

    A NaN/inf loss is a real divergence and goes to ``training.nonfinite`` as in fp32.
    """
    if scaler is None or not nonfinite_ranks:
        return False
    return all(math.isfinite(v) for r in nonfinite_ranks for v in losses[r])


def scaler_overflow(
    scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, grads: Sequence[Tensor]
) -> float:
    """Every rank, after agreeing on an overflow: back off the scale, apply no update.

    The scaler only learns of an overflow from gradients it unscales itself, and a rank
    whose own gradients are finite would see none; so every rank marks its gradients
    non-finite and lets the scaler's public path skip the step and halve the scale, the
    same way on every rank. Returns the new scale.
    """
    for g in grads:
        g.fill_(math.nan)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)  # sees the overflow: no optimizer step
    scaler.update()
    return float(scaler.get_scale())


def scaler_forget_step(scaler: torch.amp.GradScaler | None) -> None:
    """After an OOM cut a step short: drop the scaler's record that this step's gradients
    were unscaled (it would refuse the next step's ``unscale_``), keeping the scale."""
    if scaler is None:
        return
    with contextlib.suppress(AssertionError):  # nothing scaled yet: nothing recorded
        scaler.update(new_scale=scaler.get_scale())
