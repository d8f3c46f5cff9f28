"""Every process ``ups launch`` starts ends with it: a subreaper, a sweep, a sampler.

torchrun puts each worker in its own session, and the preflight all-reduce check starts
plain children, so no single process group holds them all. Instead ``ups launch``
becomes a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): any descendant whose
parent dies is re-parented to launch rather than to init, so
``psutil.Process().children(recursive=True)`` always finds every process the run
started, however the tree was cut. :func:`sweep` ends them (SIGTERM, then SIGKILL).

While torchrun runs, :class:`RssSampler` walks the same tree to record each rank's peak
resident memory, so a rank killed by SIGKILL can be explained afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
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


@dataclass
class RssSampler:
    """Peak RSS per rank, sampled every ``interval_s`` from the processes with ``RANK`` set.

    Sampled, so a spike shorter than the interval can be missed; what it records is a
    lower bound of the true peak (the kernel's own peak is per cgroup, not per rank).
    """

    interval_s: float = 0.5
    peak_rss: dict[int, int] = field(default_factory=dict)
    _rank_of: RankOf = field(default_factory=RankOf)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        for p in descendants():
            rank = self._rank_of(p)
            if rank is None:
                continue
            try:
                rss = int(p.memory_info().rss)
            except psutil.Error:
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
