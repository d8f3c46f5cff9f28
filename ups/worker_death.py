"""What a dead DataLoader worker looks like, for the outcome of the run it ended.

When a worker process dies, torch raises ``RuntimeError`` in its rank: "DataLoader worker
(pid 123) is killed by signal: Killed." (the text is libc's ``strsignal``), "... exited
unexpectedly with exit code 1. ...", or "DataLoader worker (pid(s) 123, 124) exited
unexpectedly". The rank dies of it; its own outcome and, through torchrun's error file,
``ups launch``'s name the worker, its signal and the fix. No torch import: launch reads
this too.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

_DEATH = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? (?P<pids>\d+(?:, \d+)*)\) "
    r"(?:is killed by signal: (?P<signal>[^.\n]+)|exited unexpectedly"
    r"(?: with exit code (?P<code>-?\d+))?)"
)
LOADER_DIED = "loader_died"
"""The outcome's ``cause`` when a rank failed because one of its DataLoader workers died."""
_BY_TEXT = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}

_FIXES = {
    "SIGKILL": "often the kernel's OOM killer: lower training.num_workers or "
    "training.batch_size, or give the container more memory",
    "SIGBUS": "/dev/shm is full (the workers hand batches over through it): give the "
    "container more shared memory (compose `ipc: host` or `shm_size`), or lower "
    "training.num_workers or training.prefetch_factor; `ups preflight` checks it",
    "SIGSEGV": "a crash in native code while reading data: run with training.num_workers=0 "
    "to get the stack in the rank's log",
}
_DEFAULT_FIX = "run with training.num_workers=0 to see the error in the rank itself"


@dataclass(frozen=True, slots=True)
class WorkerDeath:
    pids: tuple[int, ...]
    signal: str | None
    """Signal name (``SIGKILL``), or None when the worker exited or nothing is known."""
    exit_code: int | None

    def describe(self) -> str:
        """``DataLoader worker (pid 123) was killed by SIGKILL``, then the fix."""
        pids = ", ".join(map(str, self.pids))
        who = f"DataLoader worker (pid {pids})"
        if self.signal:
            how = f"was killed by {self.signal}"
        elif self.exit_code is not None:
            how = f"exited with code {self.exit_code}"
        else:
            how = "exited unexpectedly"
        return f"{who} {how}: {_FIXES.get(self.signal or '', _DEFAULT_FIX)}"


def worker_death(text: str) -> WorkerDeath | None:
    """The worker death ``text`` (an exception message) reports, or None."""
    match = _DEATH.search(text)
    if match is None:
        return None
    sig = match["signal"]
    name = _BY_TEXT.get(sig.strip(), sig.strip()) if sig else None
    code = int(match["code"]) if match["code"] else None
    return WorkerDeath(tuple(int(p) for p in match["pids"].split(", ")), name, code)
