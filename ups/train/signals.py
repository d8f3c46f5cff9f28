"""SIGTERM (docker stop, Vast preemption, torchrun forwarding) becomes a flag, not an exit.

The flag is read at the next per-step agreement, so every rank stops at the same step
and rank 0 can write a checkpoint before the process ends. Under ``ups launch`` the
signal is named as it was sent to launch (Ctrl-C: SIGINT, ``ups.grace.requested_stop``),
not as torchrun forwarded it.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from ups import scriptenv
from ups.grace import requested_stop


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name: str | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        sent = requested_stop(os.environ.get(scriptenv.RUN_DIR.name))
        self.signal_name = sent or signal.Signals(signum).name
        self._event.set()

    def install(self) -> StopFlag:
        signal.signal(signal.SIGTERM, self._handler)
        return self
