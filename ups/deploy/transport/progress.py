"""Transfer progress: bytes, rate and ETA on a terminal (rich), one summary line otherwise.

rich.progress replaces a hand-drawn ``\\r`` bar: it measures the rate over a moving
window (so the ETA follows a link that slows down), redraws at a bounded rate, and is
the library the training console already uses.
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    ProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as _RichProgress

from ups.console.units import human_bytes

__all__ = ["Progress", "human_bytes"]


class Progress:
    """Call :meth:`update` with byte counts; :meth:`close` prints the total and rate.

    ``total`` (bytes, known or estimated) adds the bar and the ETA.
    """

    def __init__(self, label: str, total: int | None, stream: TextIO) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.done = 0
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self._bar: _RichProgress | None = None
        if self.tty:
            columns: list[ProgressColumn] = [TextColumn(label)]
            if total:
                columns.append(BarColumn(bar_width=30))
            columns += [DownloadColumn(binary_units=True), TransferSpeedColumn()]
            if total:
                columns += [TextColumn("ETA"), TimeRemainingColumn()]
            self._bar = _RichProgress(
                *columns, console=Console(file=stream), redirect_stdout=False, transient=True
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)

    def summary(self) -> str:
        """``label 12.3 MiB in 4.1 s (3.0 MiB/s)``: what stays after the transfer.

        Only the bytes moved: a total given up front may be an estimate (``fab fetch``).
        """
        seconds = max(time.monotonic() - self.start, 1e-6)
        rate = human_bytes(self.done / seconds)
        return f"{self.label} {human_bytes(self.done)} in {seconds:.1f} s ({rate}/s)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()  # transient: the live bar gives way to the summary line
        self.stream.write(self.summary() + "\n")
        self.stream.flush()
