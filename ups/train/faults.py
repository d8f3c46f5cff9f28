"""Fault injection for tests and drills: make one rank fail in a chosen way at a chosen step.

Off unless a fault is configured (``faults:`` in the config or ``UPS_FAULTS`` in the
env, e.g. ``UPS_FAULTS="oom@1:5,segfault@1:3"`` = kind@rank:step). Shipped configs
have none, and the trainer logs a warning whenever one is armed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Sequence

import torch

from ups.config import FaultConfig
from ups.log import get_logger

ENV_VAR = "UPS_FAULTS"
log = get_logger("faults")


def parse_faults(text: str) -> list[FaultConfig]:
    """Parse ``kind@rank:step[,kind@rank:step...]``. Raises ValueError naming the bad item."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            kind, _, where = item.partition("@")
            rank, _, step = where.partition(":")
            faults.append(
                FaultConfig.model_validate({"kind": kind, "rank": int(rank), "step": int(step)})
            )
        except ValueError as exc:
            raise ValueError(
                f"{ENV_VAR}: cannot read {item!r}; expected kind@rank:step with kind one of "
                f"oom, exception, segfault, hang, sigterm ({exc})"
            ) from None
    return faults


class FaultInjector:
    """Fires this rank's configured faults at the start of their step."""

    def __init__(self, faults: Sequence[FaultConfig], rank: int, *, under_torchrun: bool) -> None:
        self.faults = {f.step: f for f in faults if f.rank == rank}
        self.under_torchrun = under_torchrun
        for f in self.faults.values():
            log.warning("fault_armed", kind=f.kind, fault_rank=f.rank, fault_step=f.step)

    def fire(self, step: int) -> None:
        fault = self.faults.pop(step, None)
        if fault is None:
            return
        log.warning("fault_injected", kind=fault.kind, step=step)
        if fault.kind == "oom":
            raise torch.OutOfMemoryError(f"injected out-of-memory fault at step {step}")
        if fault.kind == "exception":
            raise RuntimeError(f"injected exception fault at step {step}")
        if fault.kind == "segfault":
            ctypes.string_at(0)  # a real SIGSEGV: reads address 0
        if fault.kind == "hang":
            while True:  # stuck outside any collective, as a deadlocked data loader would be
                time.sleep(60)
        if fault.kind == "sigterm":
            # Under torchrun the agent is our parent: signal it as `docker stop` would signal
            # the container, and let it forward SIGTERM to every worker.
            os.kill(os.getppid() if self.under_torchrun else os.getpid(), signal.SIGTERM)
