"""Every process ``ups launch`` starts ends with it: a subreaper, a sweep, a sampler.

torchrun puts each worker in its own session, and the preflight all-reduce check starts
plain children, so no single process group holds them all. Instead ``ups launch``
becomes a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): any descendant whose
parent dies is re-parented to launch rather than to init, so
``psutil.Process().children(recursive=True)`` always finds every process the run
started, however the tree was cut. :func:`sweep` ends them (SIGTERM, then SIGKILL).

While torchrun runs, :class:`RankProcesses` finds the ranks' processes in that tree, for
both of launch's samplers: :class:`RssSampler` (each rank's peak resident memory, so a
rank killed by SIGKILL can be explained afterwards) and the stall watch
(``ups.launch.stall``). Finding them means walking the whole process table, so it is
done once for both, every few seconds; between walks they read only the processes
already known.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
from dataclasses import dataclass, field

import psutil

from ups.log import get_logger

_PR_SET_CHILD_SUBREAPER = 36
log = get_logger("ups.launch")


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where the kernel has no such thing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def sweep(grace_s: float = 5.0) -> list[int]:
    """End every descendant still alive: SIGTERM, ``grace_s`` to exit, then SIGKILL.

    Returns the pids that had to be ended (empty when the run left nothing behind)."""
    procs = descendants()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    if procs:
        pids = [p.pid for p in procs]
        log.warning("leftover_processes_ended", text="ended leftover processes", pids=pids)
    return [p.pid for p in procs]


@dataclass
class RankOf:
    """Which rank a process belongs to, by the ``RANK`` its environment carries (cached per
    pid). A rank's own children (DataLoader and compile workers) inherit it, so they count
    as the rank's; torchrun's agent and launch have none."""

    _ranks: dict[int, int | None] = field(default_factory=dict)

    def __call__(self, p: psutil.Process) -> int | None:
        if p.pid not in self._ranks:
            try:
                rank = p.environ().get("RANK")
            except psutil.Error:
                return None
            self._ranks[p.pid] = int(rank) if rank is not None and rank.isdigit() else None
        return self._ranks[p.pid]


RESCAN_S = 5.0
"""How often (at most) :class:`RankProcesses` walks the process table for new rank processes
(a rank's DataLoader and compile workers); sooner when a known one has gone."""


class RankProcesses:
    """The ranks' processes (those with ``RANK`` in their environment) and their ranks,
    shared by the threads that sample them: the process table is walked while none is
    known, every ``rescan_s``, and after a sampler said one has :meth:`gone`."""

    def __init__(self, rescan_s: float = RESCAN_S) -> None:
        self.rescan_s = rescan_s
        self.walks = 0
        """How many times the process table was walked (for tests and benchmarks)."""
        self._rank_of = RankOf()
        self._known: list[tuple[psutil.Process, int]] = []
        self._walked_at = -math.inf
        self._stale = False
        self._lock = threading.Lock()

    def current(self, now: float | None = None) -> list[tuple[psutil.Process, int]]:
        """Each rank process with its rank, walking the table only when it is due."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._stale or not self._known or now - self._walked_at >= self.rescan_s:
                self._known = self._walk()
                self._walked_at, self._stale = now, False
            return list(self._known)

    def fresh(self) -> list[tuple[psutil.Process, int]]:
        """Each rank process alive now (a walk, whatever is due): before ending them."""
        with self._lock:
            self._known, self._walked_at, self._stale = self._walk(), time.monotonic(), False
            return list(self._known)

    def gone(self) -> None:
        """A known process has ended (or is a zombie): the next look walks the table for
        what replaced it."""
        self._stale = True

    def _walk(self) -> list[tuple[psutil.Process, int]]:
        self.walks += 1
        return [(p, rank) for p in descendants() if (rank := self._rank_of(p)) is not None]


@dataclass
class RssSampler:
    """Peak RSS per rank, sampled every ``interval_s`` from the ranks' processes.

    Sampled, so a spike shorter than the interval can be missed; what it records is a
    lower bound of the true peak (the kernel's own peak is per cgroup, not per rank). A
    process a rank starts is sampled from the next walk of :class:`RankProcesses` on.
    """

    ranks: RankProcesses = field(default_factory=RankProcesses)
    interval_s: float = 0.5
    peak_rss: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        for p, rank in self.ranks.current():
            try:
                rss = int(p.memory_info().rss)
            except psutil.Error:
                self.ranks.gone()
                continue
            self.peak_rss[rank] = max(rss, self.peak_rss.get(rank, 0))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
