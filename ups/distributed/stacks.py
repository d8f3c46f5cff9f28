"""Where a hung rank is stuck: its Python stacks, dumped on request into its own log.

Every rank registers ``faulthandler`` on :data:`ups.stackdump.DUMP_SIGNAL` (all threads,
written by the C handler, so it works even while the rank is stuck in native code holding
the GIL). A rank that times out waiting for a peer reads the peer's host and pid from the
rendezvous store (``agreement.publish_whereabouts``), signals it when it runs on the same
host, waits a moment for the dump to land in the peer's log, and names the innermost frame.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from ups.distributed.agreement import whereabouts
from ups.stackdump import DUMP_SIGNAL, Frame, enable_stack_dumps, parse_dump, where_stuck

__all__ = ["DUMP_SIGNAL", "Frame", "dump_stack_of", "enable_stack_dumps", "parse_dump",
           "where_stuck"]  # fmt: skip


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
