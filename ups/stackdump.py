"""A process's Python stacks on request: the signal, the hook, the parser (standard library only).

Every thread's stack is written by ``faulthandler``'s C signal handler, so a process
stuck in native code (a collective, a CUDA sync, a ``sleep``) still answers, and nothing
needs ptrace (py-spy does, and rented containers often lack ``CAP_SYS_PTRACE``). Two
users share this one mechanism:

- the bundled trainer registers the handler on its own log (``ups.distributed.stacks``:
  a rank that times out waiting for a peer asks the peer for its stacks);
- a ``--script`` run's ranks get it at interpreter start-up: ``ups launch`` puts a
  ``sitecustomize.py`` (:data:`SHIM`) first on their ``PYTHONPATH``, which calls
  :func:`install_hook` and then runs any ``sitecustomize`` the environment already had.
  ``ups.launch.stall`` asks for the stacks when a run has stalled (docs/script.md).

The signal is a real-time one, not SIGUSR1: a script may own SIGUSR1 (Slurm's
``--signal=USR1``, Lightning's requeue handler on Slurm, which a dump request would then
trigger). Its default action ends the process, so it is only ever sent to a process
that registered the handler (``ups.launch.stall`` checks the hook's header and the
process's caught-signal mask first).

This module imports nothing outside the standard library: every rank of a script run
imports it at start-up.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DUMP_SIGNAL = signal.SIGRTMIN + 2 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1
"""Sent to a process to make it write every thread's stack (``SIGRTMIN+2``, 36 on Linux)."""
ENV_STACK_DIR = "UPS_STACK_DIR"
"""Set by ``ups launch`` for a script's ranks: where each writes ``rank<N>.txt``."""
ENV_HOOKED = "UPS_STACK_HOOK_PID"
"""Set by the hook in the process it hooked, so the rank's own children (DataLoader
workers, compile workers), which inherit the environment, do not hook again."""
HEADER = "# ups stack hook: rank {rank} pid {pid} signal {signal}"
_HEADER = re.compile(r"^# ups stack hook: rank (\d+) pid (\d+) signal (\d+)$", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):")

_hook_file: IO[str] | None = None  # kept open for the life of the process


def enable_stack_dumps(file: IO[str]) -> None:
    """Dump every thread's stack into ``file`` when this process receives :data:`DUMP_SIGNAL`."""
    faulthandler.register(DUMP_SIGNAL, file=file, all_threads=True, chain=False)


def stack_file(directory: str | Path, rank: int | str) -> Path:
    return Path(directory) / f"rank{rank}.txt"


def install_hook(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """In a script's rank (``RANK`` and :data:`ENV_STACK_DIR` set, not hooked yet): open
    its stack file, write the header ``ups launch`` looks for, register the handler, and
    mark ``environ`` hooked. Returns the file, or None where there is nothing to hook."""
    global _hook_file
    rank, directory = environ.get("RANK"), environ.get(ENV_STACK_DIR)
    if rank is None or not directory or environ.get(ENV_HOOKED):
        return None
    environ[ENV_HOOKED] = str(os.getpid())
    path = stack_file(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _hook_file = path.open("a", encoding="utf-8")
    _hook_file.write(HEADER.format(rank=rank, pid=os.getpid(), signal=int(DUMP_SIGNAL)) + "\n")
    _hook_file.flush()
    enable_stack_dumps(_hook_file)
    return path


def hooked_pids(text: str) -> dict[int, int]:
    """pid -> signal number, for every process that wrote its header into ``text``."""
    return {int(m[2]): int(m[3]) for m in _HEADER.finditer(text)}


SHIM = '''\
"""Written by ups launch (ups/stackdump.py): lets ups ask this rank for its Python stacks
when the run stalls, then runs the sitecustomize this environment had before."""
import os
import sys

try:
    from ups.stackdump import install_hook

    install_hook()
except Exception as exc:  # the script must start anyway; say why there will be no stacks
    sys.stderr.write(f"ups: no stack dumps for this process: {type(exc).__name__}: {exc}\\n")


def _chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_chain()
'''
"""The ``sitecustomize.py`` ``ups launch`` writes into a directory of its own, first on the
ranks' ``PYTHONPATH``."""


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
        elif line.strip() and threads and line.strip() != "<no Python frame>":
            break
    return threads


def _contiguous(lines: list[str], start: int, end: int) -> bool:
    """True when only frame lines and blank lines separate two thread headers."""
    return all(
        _FRAME.match(line) or not line.strip() or line.strip() == "<no Python frame>"
        for line in lines[start + 1 : end]
    )


def main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The main thread's frames: faulthandler lists the newest thread first, so the main
    thread (the oldest) is the last block."""
    return threads[-1] if threads else []


def where_stuck(threads: list[list[Frame]]) -> str | None:
    """The main thread's innermost frame, and the innermost ups frame when that differs."""
    frames = main_thread(threads)
    if not frames:
        return None
    text = str(frames[0])
    ours = next((f for f in frames if "/ups/" in f.file), None)
    if ours is not None and ours != frames[0]:
        text += f" (called from {ours})"
    return text
