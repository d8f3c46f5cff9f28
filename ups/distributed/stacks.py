"""Where a hung rank is stuck: its Python stacks, dumped on request into its own log.

Every rank registers ``faulthandler`` on SIGUSR1 (all threads, written by the C handler,
so it works even while the rank is stuck in native code holding the GIL). A rank that
times out waiting for a peer reads the peer's host and pid from the rendezvous store
(``agreement.publish_whereabouts``), signals it when it runs on the same host, waits a
moment for the dump to land in the peer's log, and names the innermost frame.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ups.distributed.agreement import whereabouts

DUMP_SIGNAL = signal.SIGUSR1
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):")


def enable_stack_dumps(file: IO[str]) -> None:
    """Dump every thread's stack into ``file`` when this process receives SIGUSR1."""
    faulthandler.register(DUMP_SIGNAL, file=file, all_threads=True, chain=False)


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


def parse_dump(text: str) -> list[list[Frame]]:
    """Each thread's frames (innermost first) from the last faulthandler dump in ``text``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _THREAD.match(line)]
    if not starts:
        return []
    # A dump is a run of thread blocks; take the blocks of the last dump only.
    first = starts[-1]
    while True:
        earlier = [s for s in starts if s < first]
        if not earlier or not _contiguous(lines, earlier[-1], first):
            break
        first = earlier[-1]
    threads: list[list[Frame]] = []
    for line in lines[first:]:
        if _THREAD.match(line):
            threads.append([])
        elif m := _FRAME.match(line):
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
        elif line.strip() and threads:
            break
    return threads


def _contiguous(lines: list[str], start: int, end: int) -> bool:
    """True when only frame lines and blank lines separate two thread headers."""
    return all(_FRAME.match(line) or not line.strip() for line in lines[start + 1 : end])


def where_stuck(threads: list[list[Frame]]) -> str | None:
    """The main thread's innermost frame, and the innermost ups frame when that differs.

    faulthandler lists the newest thread first, so the main thread is the last block.
    """
    if not threads or not threads[-1]:
        return None
    frames = threads[-1]
    text = str(frames[0])
    ours = next((f for f in frames if "/ups/" in f.file), None)
    if ours is not None and ours != frames[0]:
        text += f" (called from {ours})"
    return text


def dump_stack_of(rank: int, log_path: Path, wait_s: float = 3.0) -> str | None:
    """Ask ``rank`` for its stacks and return where its main thread is, or None.

    Only a rank on this host can be signalled; its log is ``log_path``.
    """
    found = whereabouts(rank)
    if found is None or found[0] != socket.gethostname():
        return None
    size = log_path.stat().st_size if log_path.exists() else 0
    try:
        os.kill(found[1], DUMP_SIGNAL)
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    seen = ""
    while time.monotonic() < deadline:
        time.sleep(0.2)  # the peer's signal handler writes the dump asynchronously
        try:
            with log_path.open(errors="replace") as f:
                f.seek(size)
                tail = f.read()
        except OSError:
            return None
        threads = parse_dump(tail)
        if tail == seen and threads and threads[-1]:
            return where_stuck(threads)  # complete: nothing was added since the last look
        seen = tail
    return None
