"""A byte-count progress bar for transfers (terminal only; a summary line otherwise)."""

from __future__ import annotations

import time
from typing import TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


class Progress:
    """Call :meth:`update` with byte counts; :meth:`close` prints the total and rate."""

    def __init__(self, label: str, total: int | None, stream: TextIO) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.done = 0
        self.start = time.monotonic()
        self._last_draw = 0.0
        self.tty = stream.isatty()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.tty and now - self._last_draw > 0.1:
            self._last_draw = now
            self.stream.write("\r" + self._line(now))
            self.stream.flush()

    def _line(self, now: float) -> str:
        rate = self.done / max(now - self.start, 1e-6)
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            return (
                f"{self.label} [{bar:<30}] {human_bytes(self.done)}/{human_bytes(self.total)} "
                f"{human_bytes(rate)}/s"
            )
        return f"{self.label} {human_bytes(self.done)} {human_bytes(rate)}/s"

    def close(self) -> None:
        line = self._line(time.monotonic())
        self.stream.write(("\r" if self.tty else "") + line + "\n")
        self.stream.flush()
