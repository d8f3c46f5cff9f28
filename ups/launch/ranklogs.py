"""Each rank's output, read from its own files and handed on whole lines at a time.

torchrun runs workers with ``python -u``: a ``print()`` is two writes (the text, then the
newline), so ranks sharing one pipe split each other's lines. Launch therefore has torchrun
redirect every rank's stdout and stderr on its own (``--redirects 3`` under ``--log-dir``:
``<log dir>/<run id>_<random>/attempt_0/<local rank>/stdout.log``) and follows them here,
passing on a line only once its newline has arrived. Lines of different ranks interleave;
a line never does.

Those paths are named pipes (``FifoLogsSpecs`` in :mod:`ups.launch.torchrun_child`), not
files: the output costs no disk (a full disk must not fail a rank's ``print()``; the lines
still reach launch.log when it can be written, and the console always) and has the pipe's
back-pressure. Where a pipe cannot be made, torchrun writes a plain file, which is followed
the same way. This module imports no torch: launch's own process never does.
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.05
STREAMS = ("stdout", "stderr")
_KEEP_STDERR = 400
"""Lines of each rank's stderr kept to name its exception (a deep traceback fits)."""

Emit = Callable[[int, str, str], None]
"""``emit(local_rank, stream, line)``: one whole line (no newline) of one rank's stream."""


class _Followed:
    def __init__(self, path: Path, local_rank: int, stream: str) -> None:
        self.path = path
        self.local_rank = local_rank
        self.stream = stream
        self.fd: int | None = None
        self.partial = b""

    def _take(self) -> bytes:
        """What can be read now, without waiting (a pipe with no writer yet reads as empty)."""
        if self.fd is None:
            # Non-blocking: opening a pipe's read end must not wait for its writer, and the
            # agent's open of the write end waits for this one.
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:  # not made yet: the next poll looks again
                return b""
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:  # a writer is there, with nothing more for now
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def read(self, emit: Emit, *, final: bool) -> None:
        data = self.partial + self._take()
        *lines, self.partial = data.split(b"\n")
        if final and self.partial:
            lines.append(self.partial)  # a last line without its newline: the rank has ended
            self.partial = b""
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            emit(self.local_rank, self.stream, text)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        if self.path.is_fifo():  # spent; a reader opening it later would only wait
            self.path.unlink(missing_ok=True)


class RankLogs:
    """Follow the rank files one torchrun writes under ``log_dir``; a thread, until stop().

    ``before``: the entries of ``log_dir`` that existed before this torchrun started
    (earlier attempts' directories), so only the new one is followed.
    """

    def __init__(self, log_dir: Path, nproc: int, sink: Callable[[str], None]) -> None:
        self.log_dir = log_dir
        self.nproc = nproc
        self._sink = sink
        self._before = set(log_dir.iterdir()) if log_dir.is_dir() else set()
        self._files: list[_Followed] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rank-logs", daemon=True)
        self.stderr_tail: dict[int, deque[str]] = {
            r: deque(maxlen=_KEEP_STDERR) for r in range(nproc)
        }
        """The last lines of each local rank's stderr, to name its exception."""
        self.started = threading.Event()
        """Set once torchrun has created the ranks' files (the workers exist)."""

    def __enter__(self) -> RankLogs:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _emit(self, local_rank: int, stream: str, line: str) -> None:
        if stream == "stderr" and local_rank in self.stderr_tail:
            self.stderr_tail[local_rank].append(line)
        self._sink(line)

    def _discover(self) -> None:
        """Find this torchrun's ``<run id>_<random>/attempt_0`` once it exists."""
        if self._files or not self.log_dir.is_dir():
            return
        new = [p for p in self.log_dir.iterdir() if p.is_dir() and p not in self._before]
        attempts = sorted(a for d in new for a in d.glob("attempt_*") if a.is_dir())
        if not attempts:
            return
        attempt = attempts[0]  # launch runs torchrun with --max-restarts=0: one attempt
        self._files = [
            _Followed(attempt / str(rank) / f"{stream}.log", rank, stream)
            for rank in range(self.nproc)
            for stream in STREAMS
        ]
        self.started.set()

    def _loop(self) -> None:
        try:
            while not self._done.wait(POLL_S):
                self._discover()
                for followed in self._files:
                    followed.read(self._emit, final=False)
            self._discover()
            for followed in self._files:
                followed.read(self._emit, final=True)
        finally:
            for followed in self._files:
                followed.close()


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_TRACEBACK = "Traceback (most recent call last):"


def printed_exception(stderr: list[str]) -> str | None:
    """``Type: message`` of the last Python traceback a rank printed, else None.

    Without ``@record`` there is no error file, but Python (and torch's excepthook, which
    prefixes each line with ``[rankN]:``) prints the traceback; its first unindented line
    after the frames is the exception.
    """
    lines = [_RANK_PREFIX.sub("", line, count=1) for line in stderr]
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line.strip() and not line[0].isspace():
            return line.strip()[:300]
    return None


def last_words(stderr: list[str]) -> str | None:
    """What a rank said last on stderr: its exception's ``Type: message`` when it printed a
    traceback (``Fatal Python error: Aborted`` when it aborted), else its last line."""
    exception = printed_exception(stderr)
    if exception is not None:
        return exception
    lines = [_RANK_PREFIX.sub("", line, count=1).strip() for line in stderr]
    fatal = [line for line in lines if line.startswith("Fatal Python error:")]
    if fatal:
        return fatal[-1][:300]
    said = [line for line in lines if line]
    return said[-1][:300] if said else None
