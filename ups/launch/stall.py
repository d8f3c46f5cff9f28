"""Watch a ``--script`` run for stalls; when one is found, record every rank's stack and end it.

While torchrun runs, a thread of ``ups launch`` samples each local rank once a second
(more often for the short timeouts tests use): the CPU time and I/O bytes of the rank
and its own children (``psutil``), whether it waits on the disk, the last line it printed
(``ups.launch.ranklogs``), its heartbeat file (``ups.ckpt``), and the checkpoint
directory's commits. :class:`ups.launch.stallrule.StallRule` decides, asking for the
ranks' stacks through the hook every rank got at start-up (``ups.stackdump``). On a
stall the stacks are in ``<run dir>/stacks/rank<N>.txt``, every rank's process tree is
ended (SIGTERM, :data:`KILL_GRACE_S`, SIGKILL: nothing a stalled rank could save is worth
waiting ``stop_grace_s`` for), and the outcome is ``failed``, cause ``stalled``, exit
:data:`ups.outcome.EXIT_STALLED`, naming the odd rank and its line (docs/script.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ups.ckpt import RECORD
from ups.launch.plan import LaunchPlan, hook_dir, progress_dir, stack_dir
from ups.launch.procs import RESCAN_S, RankProcesses
from ups.launch.ranklogs import RankLogs
from ups.launch.scriptrun import checkpoint_dir, newest
from ups.launch.stallrule import RankTrack, RuledOut, Stacks, Stalled, StallRule
from ups.log import get_logger
from ups.outcome import EXIT_STALLED, Outcome
from ups.stackdump import SHIM, hooked_pids, main_thread, parse_dump, stack_file

log = get_logger("ups.launch")

KILL_GRACE_S = 5.0
"""SIGTERM to SIGKILL of a stalled run's ranks."""
DUMP_WAIT_S = 3.0
"""The longest wait for the ranks' stack dumps to land."""
_MARK = "--- ups launch: stacks of rank {rank} (pid {pid}) at {time}: {why} ---"


def poll_interval(timeout_s: float) -> float:
    """Once a second; ten times per timeout for the short ones tests use."""
    return min(1.0, max(0.2, timeout_s / 10))


def rescan_interval(timeout_s: float | None) -> float:
    """How often the ranks' processes are looked for (``RankProcesses``): every
    :data:`ups.launch.procs.RESCAN_S`, or a tenth of a shorter stall timeout."""
    return RESCAN_S if not timeout_s else min(RESCAN_S, timeout_s / 10)


@dataclass(kw_only=True, slots=True)
class Stall:
    """A stall ups found and ended: what the outcome tells."""

    seconds: float
    timeout_s: float
    odd_ranks: list[int]
    summary: str
    """Where every rank was (:meth:`Stalled.summary`)."""
    stacks: str
    """The directory of the ranks' stack files."""
    last_step: dict[str, int] = field(default_factory=dict)
    """The last step each rank reported through ``ups.ckpt.progress``, by rank."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _catches(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (its default action would end it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    mask = caught[0] if caught else "0"
    return bool(int(mask, 16) >> (signum - 1) & 1)


@dataclass
class _Counters:
    cpu_s: float = 0.0
    io_bytes: int = 0


class StallWatch:
    """The watching thread of one torchrun attempt; a no-op when the plan has no timeout."""

    def __init__(
        self, plan: LaunchPlan, rank_logs: RankLogs, ranks: RankProcesses | None = None
    ) -> None:
        self.plan = plan
        self.timeout_s = plan.stall_timeout_s
        self.verdict: Stall | None = None
        self._logs = rank_logs
        self._stacks = stack_dir(plan.run_dir)
        self._progress = progress_dir(plan.run_dir)
        self._checkpoints = checkpoint_dir(plan)
        self._agent_pid: int | None = None
        self._ranks = ranks or RankProcesses(rescan_interval(plan.stall_timeout_s))
        self._seen: dict[int, tuple[int, float, int]] = {}  # pid -> (rank, cpu, io)
        self._totals: dict[int, _Counters] = {}
        self._main: dict[int, int] = {}  # rank -> its process (torchrun's child)
        self._tracks: dict[int, RankTrack] = {}
        self._commit_stamp: tuple[int, int] | None = None
        self._commit_at = -math.inf
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.timeout_s is not None

    def prepare(self) -> None:
        """Before torchrun starts: the ranks' start-up hook and their directories."""
        if not self.enabled:
            return
        hooks = hook_dir(self.plan.run_dir, self.plan.node_rank)
        try:
            for directory in (hooks, self._stacks, self._progress):
                directory.mkdir(parents=True, exist_ok=True)
            (hooks / "sitecustomize.py").write_text(SHIM)
        except OSError as exc:  # a full disk: the run goes on, unwatched, and says so
            log.warning(
                "stall_watch_off",
                text="cannot watch this run for stalls: its start-up hook cannot be written",
                error=f"{type(exc).__name__}: {exc}",
            )
            self.timeout_s = None

    def start(self, agent_pid: int) -> StallWatch:
        """Watch the ranks torchrun's agent (``agent_pid``) starts, from a thread."""
        self._agent_pid = agent_pid
        if self.enabled:
            assert self.timeout_s is not None
            context = contextvars.copy_context()  # its lines carry the run id and node rank
            self._thread = threading.Thread(
                target=context.run, args=(self._run,), name="stall-watch", daemon=True
            )
            self._thread.start()
            log.info(
                "stall_watch",
                text=f"watching for stalls: a run with no progress for {self.timeout_s:g} s "
                "is ended with every rank's stack",
                stall_timeout_s=self.timeout_s,
            )
        return self

    def __enter__(self) -> StallWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.enabled:
            self._tidy()

    # -- watching ------------------------------------------------------------------------
    def _run(self) -> None:
        rule = self.rule()
        try:
            while not self._done.wait(poll_interval(rule.timeout_s)):
                verdict = self.poll(rule, time.monotonic())
                if isinstance(verdict, RuledOut):
                    log.info("stall_ruled_out", text=f"not stalled: {verdict.why}")
                elif isinstance(verdict, Stalled):
                    self._end(verdict)
                    return
        except Exception as exc:  # a bug here must not end a healthy run: say it, stop watching
            log.error(
                "stall_watch_failed",
                text="the stall watch stopped; the run goes on unwatched",
                error=f"{type(exc).__name__}: {exc}",
            )

    def rule(self) -> StallRule:
        assert self.timeout_s is not None
        return StallRule(self.timeout_s, single_node=self.plan.nnodes == 1, cwd=Path.cwd())

    def poll(self, rule: StallRule, now: float) -> Stalled | RuledOut | None:
        """One look at the ranks (what the thread does every poll interval)."""
        self._sample(now)
        return rule.check(now, self._tracks, self._last_progress(), self._dump)

    def _sample(self, now: float) -> None:
        seen: dict[int, tuple[int, float, int]] = {}
        disk_wait: set[int] = set()
        main: dict[int, int] = {}
        for p, rank in self._ranks.current(now):
            try:
                with p.oneshot():
                    times, status, ppid = p.cpu_times(), p.status(), p.ppid()
                    try:
                        io = p.io_counters()
                        chars = int(io.read_chars + io.write_chars)
                    except (psutil.Error, AttributeError):  # /proc/PID/io unreadable here
                        chars = 0
            except psutil.Error:
                self._ranks.gone()  # ended (or a zombie): look for what replaced it
                continue
            # Children already waited for are in children_*: a rank's short-lived helper
            # processes count even when they start and end between two looks.
            cpu = times.user + times.system + times.children_user + times.children_system
            _, cpu_before, io_before = self._seen.get(p.pid, (rank, 0.0, 0))
            totals = self._totals.setdefault(rank, _Counters())
            totals.cpu_s += max(0.0, cpu - cpu_before)
            totals.io_bytes += max(0, chars - io_before)
            seen[p.pid] = (rank, cpu, chars)
            if status == psutil.STATUS_DISK_SLEEP:
                disk_wait.add(rank)
            if ppid == self._agent_pid:
                main[rank] = p.pid
        self._seen, self._main = seen, main
        live = {rank for rank, _, _ in seen.values()}
        keep = (self.timeout_s or 0) + 3 * poll_interval(self.timeout_s or 0)
        for rank in list(self._tracks):
            if rank not in live:  # the rank ended: it is not what stalls the run
                del self._tracks[rank]
        for rank in live:
            track = self._tracks.setdefault(rank, RankTrack(first_seen=now, keep_s=keep))
            track.add(now, self._totals[rank].cpu_s, self._totals[rank].io_bytes)
            track.signal_at = max(track.signal_at, self._signal_at(rank, now, rank in disk_wait))
        self._look_for_commits(now)

    def _signal_at(self, rank: int, now: float, waiting_on_disk: bool) -> float:
        """The newest line, heartbeat or disk wait of ``rank`` (monotonic seconds)."""
        at = now if waiting_on_disk else -math.inf
        local = rank - self.plan.node_rank * self.plan.nproc_per_node
        at = max(at, self._logs.last_line.get(local, -math.inf))
        with contextlib.suppress(OSError):
            beat = (self._progress / f"rank{rank}").stat().st_mtime
            at = max(at, now - max(0.0, time.time() - beat))
        return at

    def _look_for_commits(self, now: float) -> None:
        if self._checkpoints is None:
            return
        stamp = []
        for path in (self._checkpoints, self._checkpoints / RECORD):
            try:
                stamp.append(path.stat().st_mtime_ns)
            except OSError:
                stamp.append(0)
        if self._commit_stamp is not None and tuple(stamp) != self._commit_stamp:
            self._commit_at = now
        self._commit_stamp = (stamp[0], stamp[1])

    def _last_progress(self) -> float:
        return max([self._commit_at, *(t.signal_at for t in self._tracks.values())])

    # -- stacks --------------------------------------------------------------------------
    def _dump(self, why: str) -> Stacks:
        """Ask every local rank with the hook for its stacks; each rank's main thread."""
        asked: dict[int, tuple[Path, int]] = {}
        for rank, pid in sorted(self._main.items()):
            path = stack_file(self._stacks, rank)
            try:
                signum = hooked_pids(path.read_text(errors="replace")).get(pid)
                if signum is None or not _catches(pid, signum):
                    continue  # no hook in it (yet): the signal would end the rank
                when = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
                with path.open("a", encoding="utf-8") as f:
                    f.write(_MARK.format(rank=rank, pid=pid, time=when, why=why) + "\n")
                offset = path.stat().st_size
                os.kill(pid, signum)
            except OSError:
                continue
            asked[rank] = (path, offset)
        return self._collect(asked)

    def _collect(self, asked: dict[int, tuple[Path, int]]) -> Stacks:
        """Wait until every asked rank's dump has landed and stopped growing."""
        stacks: dict[int, list[Any]] = {}
        sizes: dict[int, int] = {}
        deadline = time.monotonic() + DUMP_WAIT_S
        while asked.keys() - stacks.keys() and time.monotonic() < deadline:
            time.sleep(0.1)  # the ranks' signal handlers write asynchronously
            for rank, (path, offset) in asked.items():
                if rank in stacks:
                    continue
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if size > offset and sizes.get(rank) == size:  # grown, then quiet for 0.1 s
                    with path.open(errors="replace") as f:
                        f.seek(offset)
                        stacks[rank] = main_thread(parse_dump(f.read()))
                sizes[rank] = size
        return stacks

    # -- ending --------------------------------------------------------------------------
    def _end(self, verdict: Stalled) -> None:
        assert self.timeout_s is not None
        ranks = sorted(self._tracks)
        stall = Stall(
            seconds=round(verdict.seconds, 1),
            timeout_s=self.timeout_s,
            odd_ranks=list(verdict.odd),
            summary=verdict.summary(ranks),
            stacks=str(self._stacks),
            last_step=self._last_steps(ranks),
        )
        self.verdict = stall
        log.error(
            "stall_detected",
            text=f"stalled: no progress for {stall.seconds:.0f} s: {stall.summary}; "
            f"ending the run (stacks in {stall.stacks})",
            seconds=stall.seconds,
            odd_ranks=stall.odd_ranks,
            stacks=stall.stacks,
        )
        procs = [p for p, _ in self._ranks.fresh()]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=KILL_GRACE_S)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=KILL_GRACE_S)

    def _last_steps(self, ranks: list[int]) -> dict[str, int]:
        steps = {}
        for rank in ranks:
            with contextlib.suppress(OSError, ValueError):
                steps[str(rank)] = int((self._progress / f"rank{rank}").read_text())
        return steps

    def _tidy(self) -> None:
        """Stack files that hold only hook headers (no stall was suspected) are removed,
        and the stack and heartbeat directories when nothing is left in them."""
        for path in self._stacks.glob("rank*.txt"):
            with contextlib.suppress(OSError):
                rank = int(path.stem.removeprefix("rank"))
                local = rank - self.plan.node_rank * self.plan.nproc_per_node
                mine = 0 <= local < self.plan.nproc_per_node
                if mine and "--- ups launch" not in path.read_text():
                    path.unlink()
        for directory in (self._stacks, self._progress):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty (another node's files stay)


def stalled_outcome(plan: LaunchPlan, stall: Stall, phase: str | None) -> Outcome:
    """The run's outcome after :class:`StallWatch` ended it."""
    checkpoint = newest(plan)
    again = (
        f"continue it with the same command and `--run-id {plan.run_id}` (`fab deploy`: "
        f"`--run {plan.run_id}`)"
    ) + (
        f": the script gets UPS_RESUME={checkpoint}"
        if checkpoint
        else " (it committed no checkpoint: the script starts again)"
    )
    odd = stall.odd_ranks[0] if stall.odd_ranks else None
    reason = (
        f"stalled: no rank made progress for {stall.seconds:.0f} s (stall timeout "
        f"{stall.timeout_s:g} s): {stall.summary}. Every rank's stacks are in {stall.stacks}; "
        f"ups ended the run. Fix what holds the run there, then {again}"
    )
    return Outcome(
        run_id=plan.run_id,
        outcome="failed",
        exit_code=EXIT_STALLED,
        reason=reason,
        world_size=plan.world_size,
        failed_rank=odd,
        traceback=str(stack_file(stall.stacks, odd)) if odd is not None else stall.stacks,
        cause="stalled",
        phase=phase,
        stall=stall.as_dict(),
    )
