"""Write every line ``ups launch`` and its workers print to ``launch.log`` and to stdout.

The file gets the raw lines (JSON events and torchrun's plain text), flushed per line,
because ``fab logs`` follows it remotely by byte offset. stdout gets the same raw lines
(containers, pipes, ``--log-format json``), or, when rendering for people (a terminal,
``--log-format console``), each line goes to a :class:`ups.console.ConsoleView`, which
draws the progress line and the tables (see :mod:`ups.console` for why the launcher is
the one that renders).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import IO, TextIO

from rich.console import RenderableType

from ups.console import ConsoleView


class LineTee:
    """A text stream that duplicates whole lines to a log file and to a console stream.

    Usable as the ``stdout`` of :func:`ups.log.setup_logging`, so launch's own events and
    its workers' output land in one file in the order they happened.
    """

    def __init__(self, path: Path, console: TextIO, *, render: bool | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] = path.open("a", buffering=1, encoding="utf-8")
        self._console: TextIO | None = console
        render = console.isatty() if render is None else render
        self._view = ConsoleView(console, live=True) if render else None
        self._partial = ""
        self._file_error: str | None = None
        # Reentrant: a stop signal's handler may run (and raise) while the main thread is
        # inside write_line. Handlers never write here themselves (a write into the
        # buffered file from inside it raises; ups.launch.torchrun queues their lines).
        self._lock = threading.RLock()

    def isatty(self) -> bool:
        # Callers that ask get "no": they must write JSON, which this stream renders itself.
        return False

    def write_line(self, line: str) -> None:
        """Write one line (without its newline) to both sinks."""
        with self._lock:
            self._write_file(line)
            if self._view is not None:
                self._view.feed(line)  # the view drops output once the terminal is gone
                return
            if self._console is None:
                return
            try:
                self._console.write(line + "\n")
                self._console.flush()
            except OSError:
                # The terminal or SSH session went away (EPIPE, EIO). The run goes on and
                # launch.log keeps every line; only the console copy stops.
                self._console = None

    def write_block(self, text: str, renderable: RenderableType) -> None:
        """A block such as the preflight report: ``text`` to the file (and raw stdout),
        ``renderable`` (the same content, in colour) to a person's console."""
        with self._lock:
            if self._view is None:
                for line in text.splitlines():
                    self.write_line(line)
                return
            for line in text.splitlines():
                self._write_file(line)
            self._view.show(renderable)

    def _write_file(self, line: str) -> None:
        if self._file_error is not None:
            return
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            # A full disk (ENOSPC) or a failing one: the console keeps every line, the exit
            # code stays the run's; say once what launch.log is missing from here on.
            self._file_error = f"{type(exc).__name__}: {exc}"
            if self._console is not None:
                self._console.write(
                    f"ups launch: cannot write {self.path} ({self._file_error}); "
                    "the rest of this run's output goes to the console only\n"
                )

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self.write_line(line)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):  # reported by _write_file
            self._file.flush()

    def close(self) -> None:
        if self._partial:
            self.write_line(self._partial)
            self._partial = ""
        if self._view is not None:
            self._view.close()
        with contextlib.suppress(OSError):  # buffered bytes that no longer fit: reported
            self._file.close()

    def __enter__(self) -> LineTee:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
