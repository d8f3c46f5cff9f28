"""Ends of a run that every rank agreed on at the same step, with the reason and exit code.

Raised on every rank at once, right after an agreement (never from one rank alone), so
``ups.train.run`` can write the outcome and exit without any rank left in a collective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ups.outcome import EXIT_FAILED, EXIT_NONFINITE


class RunFailed(RuntimeError):
    """Every rank agreed the run cannot go on."""

    def __init__(
        self, reason: str, *, exit_code: int, cause: str, failed_rank: int | None = None
    ) -> None:
        super().__init__(reason)
        self.reason, self.exit_code, self.failed_rank = reason, exit_code, failed_rank
        self.cause = cause
        """The ``cause`` of the outcome: a key of ``ups.retry.RULES``."""


class TooManySkips(RunFailed):
    """Consecutive steps were skipped past ``training.max_consecutive_skips``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, exit_code=EXIT_FAILED, cause="too_many_oom_skips")


def _fmt(value: float) -> str:
    return repr(value) if not math.isfinite(value) else f"{value:.4g}"


def nonfinite_failure(
    step: int,
    ranks: Sequence[int],
    losses: Sequence[Sequence[float]],
    tasks: Sequence[str],
    *,
    lr: float,
    grad_clip: float,
) -> RunFailed:
    """The reason for ``training.nonfinite=fail``: where, what the losses were, the fix."""
    per_rank = "; ".join(
        f"rank {r}: " + ", ".join(f"{t}={_fmt(v)}" for t, v in zip(tasks, losses[r], strict=True))
        for r in ranks
    )
    what = "loss" if any(not math.isfinite(v) for r in ranks for v in losses[r]) else "gradient"
    clip = (
        f"lower training.grad_clip (now {grad_clip:g})"
        if grad_clip > 0
        else "set training.grad_clip (e.g. 1.0)"
    )
    return RunFailed(
        f"non-finite {what} at step {step} on rank(s) {list(ranks)} (per-task losses: "
        f"{per_rank}); no update was applied with it. Fix: lower training.lr (now {lr:g}) "
        f"and {clip}, then start a fresh run; or set training.nonfinite=skip to skip such steps",
        exit_code=EXIT_NONFINITE,
        cause="nonfinite",
        failed_rank=ranks[0],
    )


def nonfinite_metrics(metrics: dict[str, float]) -> RunFailed | None:
    """A run never ends ``finished`` with a NaN/inf evaluation metric."""
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if not bad:
        return None
    return RunFailed(
        f"evaluation produced non-finite metrics ({', '.join(f'{k}={metrics[k]!r}' for k in bad)});"
        " the trained weights are not usable. Fix: lower training.lr and set "
        "training.grad_clip, then start a fresh run",
        exit_code=EXIT_NONFINITE,
        cause="nonfinite",
    )
