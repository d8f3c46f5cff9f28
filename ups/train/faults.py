"""Fault injection for tests and drills: make one rank fail in a chosen way at a chosen step.

Off unless a fault is configured (``faults:`` in the config, or ``UPS_FAULTS`` in the env,
read by ``ups.config.faults``). Shipped configs have none, and the trainer logs a warning
whenever one is armed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Sequence

import torch

from ups import scriptenv
from ups.config import FaultConfig
from ups.config.schema import FaultPoint
from ups.log import get_logger

ATTEMPT_VAR = scriptenv.ATTEMPT.name
"""Set by ``ups launch`` for each torchrun attempt (1, 2, ...)."""
log = get_logger("faults")


def _allocate_past_device_memory(step: int) -> None:
    """A real out-of-memory error from the CUDA caching allocator: hold half of what is
    free, then ask for more than the device has in all. The held block stays referenced
    by this frame (and so by the error's traceback), as a failed forward's activations do."""
    device = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(device)
    before = torch.cuda.memory_allocated(device)
    log.warning(
        "fault_alloc", step=step, free_bytes=free, total_bytes=total, allocated_bytes=before
    )
    held = torch.empty(free // 2, dtype=torch.uint8, device=device)
    too_much = torch.empty(total, dtype=torch.uint8, device=device)
    del held, too_much  # not reached: the second allocation raises


SLOW_SAVE_S = 35.0
"""How much ``slow_save`` delays a checkpoint write: past torchrun's default 30 s grace."""
PAUSE_POLL_S = 0.1
"""How often a ``pause`` looks whether the run has been asked to stop."""


class FaultInjector:
    """Fires this rank's configured faults at their step and point."""

    def __init__(
        self,
        faults: Sequence[FaultConfig],
        rank: int,
        *,
        under_torchrun: bool,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``stopping``: whether the run has been asked to stop (what ends a ``pause``)."""
        mine = [f for f in faults if f.rank == rank]
        attempt = int(os.environ.get(ATTEMPT_VAR, "1"))
        if mine and attempt > 1:
            # A drill's fault hits the first attempt only: an in-place restart (--max-restarts)
            # replays the same steps and must be able to get past them.
            log.warning("faults_disarmed", attempt=attempt, faults=len(mine))
            mine = []
        self.faults = {(f.step, f.point): f for f in mine if f.kind != "slow_save"}
        self.slow_save_from = min((f.step for f in mine if f.kind == "slow_save"), default=None)
        self.under_torchrun = under_torchrun
        self.stopping = stopping
        for f in mine:
            log.warning(
                "fault_armed", kind=f.kind, fault_rank=f.rank, fault_step=f.step, point=f.point
            )

    def before_save(self, step: int) -> None:
        """Called as a checkpoint of ``step`` is about to be written."""
        if self.slow_save_from is not None and step >= self.slow_save_from:
            log.warning("fault_injected", kind="slow_save", step=step, delay_s=SLOW_SAVE_S)
            time.sleep(SLOW_SAVE_S)

    def corrupt(self, step: int, losses: torch.Tensor) -> torch.Tensor:
        """``losses`` made NaN when a ``nan`` fault is armed for this step, else unchanged."""
        fault = self.faults.get((step, "start"))
        if fault is None or fault.kind != "nan":
            return losses
        del self.faults[(step, "start")]
        log.warning("fault_injected", kind=fault.kind, step=step, point="loss")
        return losses * float("nan")

    def fire(self, step: int, point: FaultPoint = "start") -> None:
        if not self.faults:
            return
        fault = self.faults.get((step, point))
        if fault is None or fault.kind == "nan":  # nan acts in corrupt(), on the loss
            return
        del self.faults[(step, point)]
        log.warning("fault_injected", kind=fault.kind, step=step, point=point)
        if fault.kind == "oom":
            raise torch.OutOfMemoryError(f"injected out-of-memory fault at step {step} ({point})")
        if fault.kind == "alloc":
            _allocate_past_device_memory(step)
        if fault.kind == "exception":
            raise RuntimeError(f"injected exception fault at step {step}")
        if fault.kind == "segfault":
            ctypes.string_at(0)  # a real SIGSEGV: reads address 0
        if fault.kind == "hang":
            while True:  # stuck outside any collective, as a deadlocked data loader would be
                time.sleep(60)
        if fault.kind == "pause":
            while not self.stopping():  # asleep: a held run costs no CPU
                time.sleep(PAUSE_POLL_S)
            log.warning("fault_pause_ended", step=step, point=point)
        if fault.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "sigterm":
            # Under torchrun the agent is our parent: signal it as `docker stop` would signal
            # the container, and let it forward SIGTERM to every worker.
            os.kill(os.getppid() if self.under_torchrun else os.getpid(), signal.SIGTERM)
