"""When a script run has stalled, and where each rank is: the rule, as pure logic.

``ups.launch.stall`` samples the ranks and feeds this module; nothing here touches a
process, so every case is a unit test (tests/test_stall_rule.py). Why the rule is what it
is (docs/script.md, "A stalled script"):

- **Idle** rank: for the whole window, no line printed, no heartbeat (``ups.ckpt``), no
  wait on the disk, no sampling interval in which its processes (the rank and its own
  children) used :data:`CPU_IDLE_FRACTION` of a core or moved :data:`IO_ACTIVE_BYTES`,
  and less than that share of a core and :data:`IO_IDLE_BYTES` over the window. A rank
  asleep, or blocked in a gloo collective, is idle; a rank computing, compiling or
  writing is not.
- On a GPU a rank waiting in an NCCL collective spins a core (CUDA's spin-wait): it looks
  busy. So CPU time alone cannot tell "rank 0 evaluates while rank 1 waits at a barrier"
  (fine) from "rank 1 sleeps while rank 0 spins in all_reduce" (the hang). The stacks
  can: two dumps half a timeout apart. A busy rank whose stack did not move spins in one
  call; a rank whose stack moved works, and the idle ranks wait for it.
- **Stalled** after ``timeout`` seconds with no progress anywhere (no line, heartbeat or
  checkpoint commit from any rank) and some rank idle all that time, when every busy rank
  is stuck at one place and either an idle rank is outside any collective (it is the one
  the others wait for), or, on a single node, every rank is idle (a collective that can
  never complete). An idle rank inside a collective on a multi-node run may be waiting
  for another node's work: that node's watcher decides.
"""

from __future__ import annotations

import linecache
import math
import os
import re
import sysconfig
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ups.stackdump import Frame

CPU_IDLE_FRACTION = 0.05
"""Below this share of one core over the window a rank is idle. An asleep or gloo-blocked
rank uses ~0; NCCL's background threads of an idle rank a fraction of a percent; a
rank doing anything uses far more."""
IO_IDLE_BYTES = 1 << 20
"""Bytes read or written (files, sockets, pipes) over the window below which a rank is idle."""
IO_ACTIVE_BYTES = 64 << 10
"""Bytes moved within one sampling interval that make it an active one."""
_PEER_WAIT = re.compile(r"[/\\]torch[/\\](distributed|nn[/\\]parallel|autograd)[/\\]")
"""Frames where a rank waits for its peers: torch.distributed's collectives and barriers,
DDP's forward, and backward (where DDP's reducer waits for the gradient all-reduce)."""
_WRAPPERS = frozenset({"wrapper", "inner", "wrapped", "decorate_context", "_fn"})

Stacks = Mapping[int, list[Frame]]
"""Each rank's main-thread frames (innermost first); an empty list: no stacks from it."""


@dataclass
class RankTrack:
    """One rank's cumulative CPU seconds and I/O bytes over time, and its last signal."""

    first_seen: float
    keep_s: float
    samples: deque[tuple[float, float, int]] = field(default_factory=deque)
    signal_at: float = -math.inf
    """The last line printed, heartbeat or disk wait (monotonic seconds)."""
    active_at: float = -math.inf
    """The end of the last sampling interval in which the rank used at least
    :data:`CPU_IDLE_FRACTION` of a core or moved :data:`IO_ACTIVE_BYTES`."""

    def add(self, t: float, cpu_s: float, io_bytes: int) -> None:
        if self.samples:
            t0, cpu0, io0 = self.samples[-1]
            if cpu_s - cpu0 >= CPU_IDLE_FRACTION * (t - t0) or io_bytes - io0 >= IO_ACTIVE_BYTES:
                self.active_at = t
        self.samples.append((t, cpu_s, io_bytes))
        # Keep one sample at or before t - keep_s: the base of the longest window asked.
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.keep_s:
            self.samples.popleft()

    def idle_for(self, now: float, window: float) -> bool:
        """True when this rank showed no sign of work for the last ``window`` seconds."""
        if now - self.first_seen < window or max(self.signal_at, self.active_at) > now - window:
            return False
        base = next((s for s in reversed(self.samples) if s[0] <= now - window), None)
        if base is None:
            return False
        _, cpu, io = self.samples[-1]
        return cpu - base[1] < CPU_IDLE_FRACTION * window and io - base[2] < IO_IDLE_BYTES


@dataclass(frozen=True, slots=True)
class Where:
    """Where a rank's main thread is, for people and for the rule."""

    text: str
    """``in all_reduce at train.py:40 (`dist.all_reduce(t)`)``."""
    waits_on_peers: bool
    """Inside a collective, a barrier, DDP's forward or backward."""


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], str(Path(__file__).parents[1])}
    return tuple(os.path.join(r, "") for r in roots)


_LIBRARY_ROOTS = _library_roots()


def _library(file: str) -> bool:
    return (
        file.startswith("<")
        or "site-packages" in file
        or "dist-packages" in file
        or file.startswith(_LIBRARY_ROOTS)
    )


def _shown(file: str, cwd: Path) -> str:
    path = Path(file)
    try:
        return str(path.relative_to(cwd)) if path.is_absolute() else file
    except ValueError:
        return file


def locate(frames: list[Frame], cwd: Path) -> Where | None:
    """The innermost frame of the script's own code, and the library call it is in."""
    if not frames:
        return None
    waits = any(_PEER_WAIT.search(f.file) for f in frames)
    mine = next((i for i, f in enumerate(frames) if not _library(f.file)), None)
    anchor = frames[mine] if mine is not None else frames[0]
    called = frames[:mine] if mine is not None else []
    named = [f.func for f in called if not f.func.startswith("_") and f.func not in _WRAPPERS]
    linecache.checkcache(anchor.file)  # the script may have changed since an earlier attempt
    source = linecache.getline(anchor.file, anchor.line).split("  #")[0].strip()
    text = f"in {named[0]} " if named else ""
    text += f"at {_shown(anchor.file, cwd)}:{anchor.line}"
    if source:
        text += f" (`{source[:80]}`)"
    return Where(text, waits)


@dataclass(frozen=True, slots=True)
class Stalled:
    """The verdict: which ranks are odd, and where every rank is."""

    seconds: float
    """How long no rank made progress."""
    odd: tuple[int, ...]
    """The rank(s) not where the others are: idle outside any collective, else the ranks
    in the smallest group by place; empty when every rank is at the same place."""
    outside: tuple[int, ...]
    """Idle ranks outside any collective: the ones the others wait for."""
    spinning: tuple[int, ...]
    """Busy ranks whose stack did not move (a spin-wait: NCCL on GPUs)."""
    where: dict[int, str]
    """Each rank's place (:class:`Where` text); a rank that gave no stack is absent."""

    def summary(self, ranks: list[int]) -> str:
        """``rank 1 at train.py:78 (`time.sleep(3600)`), outside any collective; ranks 0,
        2, 3 in all_reduce at train.py:40 (`dist.all_reduce(t)`)``."""
        parts = []
        for r in self.odd:
            outside = ", outside any collective" if r in self.outside else ""
            parts.append(f"rank {r} {self.where.get(r, 'gave no stack')}{outside}")
        groups: dict[str, list[int]] = {}
        for r in ranks:
            if r in self.odd:
                continue
            place = self.where.get(r, "gave no stack (no ups stack hook in it)")
            if r in self.spinning:
                place = f"spinning {place}"
            groups.setdefault(place, []).append(r)
        for place, members in groups.items():
            who = "rank" if len(members) == 1 else "ranks"
            parts.append(f"{who} {', '.join(map(str, members))} {place}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class RuledOut:
    """A suspicion that the stacks cleared: the idle ranks wait for work that moves."""

    why: str


def _minority(where: dict[int, str]) -> tuple[int, ...]:
    groups: dict[str, list[int]] = {}
    for r, text in where.items():
        groups.setdefault(text, []).append(r)
    if len(groups) < 2:
        return ()
    largest = max(len(g) for g in groups.values())
    if sum(len(g) == largest for g in groups.values()) > 1:
        return ()  # no majority to be odd against
    return tuple(sorted(r for g in groups.values() if len(g) < largest for r in g))


def judge(
    ranks: set[int],
    idle: set[int],
    first: Stacks,
    second: Stacks,
    *,
    single_node: bool,
    cwd: Path,
    seconds: float,
) -> Stalled | RuledOut:
    """Decide from the idle ranks and two dumps half a timeout apart (``first``, ``second``)."""
    busy = ranks - idle
    # Without both stacks a busy rank may be working: it counts as moving.
    moving = sorted(b for b in busy if not first.get(b) or first.get(b) != second.get(b))
    if moving:
        return RuledOut(
            f"rank(s) {', '.join(map(str, moving))} busy and not stuck at one place; the "
            f"idle rank(s) {', '.join(map(str, sorted(idle)))} wait for them"
        )
    places = {r: w for r in ranks if (w := locate(list(second.get(r, [])), cwd)) is not None}
    where = {r: w.text for r, w in places.items()}
    outside = tuple(sorted(r for r in idle if r in places and not places[r].waits_on_peers))
    if outside:
        return Stalled(seconds, outside, outside, tuple(sorted(busy)), where)
    if not busy and single_node:
        return Stalled(seconds, _minority(where), (), (), where)
    waiting = f"idle rank(s) {', '.join(map(str, sorted(idle)))} wait inside a collective"
    if busy:
        return RuledOut(f"{waiting} for rank(s) {', '.join(map(str, sorted(busy)))}, which work")
    return RuledOut(f"{waiting}, maybe for another node's work")


@dataclass
class StallRule:
    """The stall rule over time: a first dump once a rank has been idle for half the
    timeout with no progress anywhere, the verdict once some rank has been idle for the
    full timeout and no other rank became idle less than a timeout ago."""

    timeout_s: float
    single_node: bool
    cwd: Path
    episode: tuple[float, Stacks] | None = None
    """When the first dump of the current suspicion was taken, and its stacks."""

    def check(
        self,
        now: float,
        tracks: Mapping[int, RankTrack],
        last_progress: float,
        dump: Callable[[str], Stacks],
    ) -> Stalled | RuledOut | None:
        """``last_progress``: the newest line, heartbeat, disk wait or checkpoint commit of
        any rank. ``dump(why)`` asks every rank for its stacks."""
        half = self.timeout_s / 2
        idle_half = {r for r, t in tracks.items() if t.idle_for(now, half)}
        if last_progress > now - half or not idle_half:
            self.episode = None
            return None
        if self.episode is None:
            self.episode = (now, dump(f"rank(s) {sorted(idle_half)} idle for {half:g} s"))
            return None
        started, first = self.episode
        idle = {r for r, t in tracks.items() if t.idle_for(now, self.timeout_s)}
        # A rank idle for half the timeout but not all of it worked until recently: the
        # run made progress less than a timeout ago, so the verdict waits for it.
        settling = idle_half - idle
        if now - started < half or not idle or settling:
            return None
        second = dump(f"rank(s) {sorted(idle)} idle for {self.timeout_s:g} s")
        since = max([last_progress, *(tracks[r].active_at for r in idle)])
        seconds = now - (since if since > -math.inf else started - half)
        verdict = judge(
            set(tracks), idle, first, second,
            single_node=self.single_node, cwd=self.cwd, seconds=seconds,
        )  # fmt: skip
        if isinstance(verdict, RuledOut):
            self.episode = (now, second)  # the next verdict half a timeout from now
        return verdict
