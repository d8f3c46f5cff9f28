"""SIGTERM (docker stop, Vast preemption, torchrun forwarding) becomes a flag, not an exit.

The flag is read at the next per-step agreement, so every rank stops at the same step
and rank 0 can write a checkpoint before the process ends.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name: str | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def install(self) -> StopFlag:
        signal.signal(signal.SIGTERM, self._handler)
        return self
