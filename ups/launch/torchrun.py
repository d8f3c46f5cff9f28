"""Run torchrun for a plan and stream everything it and its workers print.

torchrun runs in a child process (``python -m ups.launch.torchrun_child``), not in this one,
because torchrun's agent installs its own signal handlers, which would otherwise fight
this process's. The child still runs torchrun in-process (``torch.distributed.run.run``),
so failures come back exactly, as JSON. The agent's own lines arrive on the child's
pipe; each rank's go to files of their own, followed by :mod:`ups.launch.ranklogs`; both
reach the tee whole lines at a time.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from ups import scriptenv
from ups.fsio import atomic_write_text
from ups.grace import STOP_REQUEST_FILE
from ups.launch.plan import LaunchPlan, rank_log_dir
from ups.launch.procs import RankProcesses, RssSampler, sweep
from ups.launch.ranklogs import RankLogs, last_words, printed_exception
from ups.launch.stall import Stall, StallWatch, rescan_interval
from ups.launch.tee import LineTee
from ups.log import get_logger
from ups.outcome import EXIT_PREEMPTED

log = get_logger("ups.launch")


@dataclass(kw_only=True, slots=True)
class WorkerFailure:
    """One failed worker as torchrun's agent saw it."""

    rank: int
    local_rank: int
    exitcode: int
    signal: str | None
    error_file: str | None
    message: str
    timestamp: int
    pid: int | None = None
    printed: str | None = None
    """``Type: message`` of the last traceback the rank printed (when it left no error file)."""


@dataclass(kw_only=True, slots=True)
class WorkerExit:
    """How one worker of this node ended, read from the process itself (whatever torchrun
    listed as failed): its exit code, or the signal that ended it."""

    rank: int
    local_rank: int
    exitcode: int
    """The process's return code: negative for a signal (-15: SIGTERM)."""
    signal: str | None
    pid: int | None = None
    last_line: str | None = None
    """What it printed last on stderr: its exception's line when it printed a traceback."""

    @property
    def clean(self) -> bool:
        """Exited by itself with 0, or 75 (the trainer's "preempted", a script's too)."""
        return self.exitcode in (0, EXIT_PREEMPTED)

    def describe(self) -> str:
        """``rank 1 exited with code 3`` / ``rank 0 died of SIGKILL``."""
        if self.signal:
            return f"rank {self.rank} died of {self.signal}"
        return f"rank {self.rank} exited with code {self.exitcode}"


@dataclass(kw_only=True, slots=True)
class TorchrunResult:
    rc: int
    """The torchrun child's exit code (0, 1, or 128 + signum)."""
    status: str
    """ok, failed (a worker failed), signal (agent stopped), error (torchrun itself failed)."""
    failures: list[WorkerFailure] = field(default_factory=list)
    signal: str | None = None
    error: str | None = None
    received_signal: str | None = None
    """The signal ``ups launch`` received and forwarded, if any."""
    phase: str = "torchrun_start"
    """The last phase a worker announced (``phase`` events), or torchrun_start."""
    peak_rss: dict[int, int] = field(default_factory=dict)
    """Sampled peak resident memory per rank, in bytes."""
    workers: list[WorkerExit] = field(default_factory=list)
    """Every worker this node started, by rank, as it really ended (``WorkerWatch`` in
    :mod:`ups.launch.torchrun_child`); empty when none started."""
    stopped_at: float | None = None
    """When ``ups launch`` received the stop (``time.time()``), with ``received_signal``."""
    store_keys: tuple[int, int] | None = None
    """Keys in the rendezvous store when the workers started and once they had all exited
    0 (before the agents' exit barrier); None when not known."""
    stall: Stall | None = None
    """Set when ups found the run stalled and ended it (``ups.launch.stall``)."""

    def unclean(self) -> list[WorkerExit]:
        """The workers that did not exit 0 (or 75) by themselves, lowest rank first."""
        return [w for w in self.workers if not w.clean]

    @property
    def store_untouched(self) -> bool:
        """The workers ran and exited 0 without writing one key to the rendezvous store:
        they formed no process group (every backend's ranks meet through that store)."""
        return self.store_keys is not None and self.store_keys[1] == self.store_keys[0]

    def failure_of(self, rank: int) -> WorkerFailure | None:
        return next((f for f in self.failures if f.rank == rank), None)

    def root_cause(self) -> WorkerFailure | None:
        """The failure that started it, by evidence (:func:`blame_order`), never by which
        rank torchrun happened to see exit first: then the earliest, then the lowest rank."""
        return min(self.failures, key=lambda f: (blame_order(f), f.timestamp, f.rank), default=None)


_PEER_LOST = re.compile(
    r"gloo|nccl|connection (?:reset|closed|refused)|broken pipe|Dist(?:Network|Backend|Store)Error",
    re.IGNORECASE,
)
"""What a rank raises when only its peer went away: the collective's connection broke."""


def peer_lost(failure: WorkerFailure) -> bool:
    """The rank exited because a collective's connection broke: it saw a peer die."""
    said = f"{failure.message}\n{failure.printed or ''}"
    return failure.signal is None and _PEER_LOST.search(said) is not None


PEER_LOST = 3
""":func:`blame_order` of a rank that only saw its peer's connection break."""


def blame_order(f: WorkerFailure) -> int:
    """How strong the evidence is that ``f`` is the cause rather than a consequence
    (0: strongest). Ranks' reports arrive in any order; this decides, not the order.

    0. a crash signal (SIGSEGV, SIGBUS, SIGABRT...): the rank died of itself;
    1. its own exception (an exit code, and not a broken connection);
    2. SIGKILL: from outside (the OOM killer, ``docker kill``), or from torchrun when a
       rank outlived the stop grace after another failure; either way the rank died;
    3. a broken collective ("Connection reset by peer", a gloo/NCCL error): a survivor
       reacting to a peer's death, never the culprit while the dead peer is listed;
    4. SIGTERM or exit 75: torchrun stopped the rank once another had failed.
    """
    if f.signal == "SIGTERM" or f.exitcode == EXIT_PREEMPTED:
        return 4
    if peer_lost(f):
        return PEER_LOST
    if f.signal == "SIGKILL":
        return 2
    if f.signal is None:
        return 1
    return 0


def _read_result(path: Path, rc: int) -> TorchrunResult:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return TorchrunResult(
            rc=rc, status="error", error=f"torchrun exited {rc} without a result file"
        )
    failures = [
        WorkerFailure(
            rank=int(rank),
            local_rank=f["local_rank"],
            exitcode=f["exitcode"],
            signal=f["signal"],
            error_file=f["error_file"],
            message=f["message"],
            timestamp=f["timestamp"],
            pid=f.get("pid"),
        )
        for rank, f in data.get("failures", {}).items()
    ]
    workers = [
        WorkerExit(
            rank=int(rank),
            local_rank=w["local_rank"],
            exitcode=w["exitcode"],
            signal=w["signal"],
            pid=w.get("pid"),
        )
        for rank, w in (data.get("workers") or {}).items()
    ]
    keys = data.get("store_keys")
    return TorchrunResult(
        rc=rc,
        status=data.get("status", "error"),
        failures=sorted(failures, key=lambda f: f.rank),
        signal=data.get("signal"),
        error=data.get("error"),
        workers=sorted(workers, key=lambda w: w.rank),
        store_keys=(keys["at_start"], keys["at_end"]) if keys else None,
    )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def received(name: str) -> str:
    """How people know the signal: Ctrl-C is SIGINT, a closed terminal SIGHUP."""
    how = {"SIGINT": " (Ctrl-C)", "SIGHUP": " (terminal closed)"}.get(name, "")
    return f"{name}{how} received"


@contextmanager
def handling_stop_signals(
    handler: Callable[[int, FrameType | None], None],
) -> Iterator[None]:
    """Route SIGTERM/SIGINT/SIGHUP to ``handler`` for the block, then restore the old ones."""
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stop_announcement(plan: LaunchPlan | None, name: str) -> str:
    """What a stop asks of whom: ups's trainer stops at a step and saves; a script is only
    sent SIGTERM, and what it does then is its own (docs/script.md)."""
    if plan is None or plan.script is None:
        return f"{received(name)}: the workers stop at the next step and save a checkpoint"
    return (
        f"{received(name)}: SIGTERM sent to the script's ranks; they have "
        f"{plan.stop_grace_s} s (stop_grace_s) to save and exit"
    )


@contextmanager
def _forward_signals(
    proc: subprocess.Popen[bytes],
    state: dict[str, str],
    request: Path,
    plan: LaunchPlan | None = None,
) -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP here -> one SIGTERM to torchrun, which stops the workers.

    Only the first signal is forwarded: torchrun is then already giving the workers their
    grace period (``--shutdown-timeout``) before SIGKILL; a second signal would cut it short.
    Always SIGTERM, whatever arrived: a worker still importing has no handler yet, and dies
    of SIGTERM quietly where SIGINT would print a KeyboardInterrupt traceback. The signal
    that arrived is the one the outcome names (``finalize``), and the workers too: it is
    written to ``request`` (``ups.grace.STOP_REQUEST_FILE``) before SIGTERM goes out.
    """

    # The handler runs in the main thread between any two bytecodes, possibly while that
    # thread is inside a write to launch.log (a second signal while the first one's line is
    # written): a write from the handler there is a reentrant call into the same buffered
    # file, which raises. So the handler only acts; its lines go out from a thread of
    # their own, through a queue whose put() is safe in a signal handler.
    lines: queue.SimpleQueue[tuple[str, dict[str, str]] | None] = queue.SimpleQueue()

    def say() -> None:
        while (item := lines.get()) is not None:
            event, fields = item
            log.warning(event, **fields)

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if "signal" in state:
            lines.put(
                (
                    "stop_signal_repeated",
                    {"text": "already stopping; workers are finishing", "signal": name},
                )
            )
            return
        state["signal"] = name
        state["stopped_at"] = repr(time.time())
        with suppress(OSError):  # a full disk: the workers then say SIGTERM, nothing worse
            atomic_write_text(request, name + "\n")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        text = stop_announcement(plan, name)
        lines.put(
            (
                "stop_signal_received",
                {"text": text, "signal": name, "forwarded": "SIGTERM to torchrun"},
            )
        )

    speaker = threading.Thread(target=say, name="stop-lines", daemon=True)
    speaker.start()
    try:
        with handling_stop_signals(handler):
            yield
    finally:
        lines.put(None)
        speaker.join(timeout=10)


def _passer(tee: LineTee, state: dict[str, str]) -> Callable[[str], None]:
    """Tee a line; remember the workers' latest ``phase`` event for the outcome."""

    def pass_on(line: str) -> None:
        tee.write_line(line)
        if '"phase"' in line:
            with suppress(ValueError, KeyError, TypeError):
                state["phase"] = str(json.loads(line)["phase"])

    return pass_on


def _follow(stdout: IO[bytes], pass_on: Callable[[str], None]) -> None:
    """The agent's own lines (torchrun's warnings, a worker failure's summary)."""
    for raw in stdout:
        pass_on(raw.decode("utf-8", errors="replace").rstrip("\r\n"))


def run_torchrun(plan: LaunchPlan, tee: LineTee, attempt: int = 1) -> TorchrunResult:
    """Start torchrun for ``plan``, tee its output line by line, return how it ended.

    Anything torchrun leaves behind (a worker it failed to kill) is swept before this
    returns, so the pipe always closes and no rank outlives the attempt.
    """
    result_path = Path(plan.result_path)
    result_path.unlink(missing_ok=True)
    request = Path(plan.run_dir) / STOP_REQUEST_FILE
    request.unlink(missing_ok=True)  # an earlier attempt's stop is not this one's
    cmd = [sys.executable, "-m", "ups.launch.torchrun_child", str(result_path), *plan.torchrun_argv]
    env = {**os.environ, **plan.env, scriptenv.ATTEMPT.name: str(attempt)}
    state: dict[str, str] = {"phase": "torchrun_start"}
    pass_on = _passer(tee, state)
    rank_logs = RankLogs(rank_log_dir(plan.run_dir, plan.node_rank), plan.nproc_per_node, pass_on)
    ranks = RankProcesses(rescan_interval(plan.stall_timeout_s))  # one walk for both samplers
    watch = StallWatch(plan, rank_logs, ranks)
    watch.prepare()
    log.info(
        "torchrun_starting",
        text="starting torchrun",
        cmd=cmd,
        shutdown_timeout_s=plan.stop_grace_s,
    )
    # Own session: a Ctrl-C in the terminal reaches only launch, which turns it into one
    # SIGTERM for torchrun (the trainer's preemption path) instead of a SIGINT storm.
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    reader = threading.Thread(target=_follow, args=(proc.stdout, pass_on), daemon=True)
    with (
        _forward_signals(proc, state, request, plan),
        RssSampler(ranks) as sampler,
        rank_logs,
        watch.start(proc.pid),
    ):
        reader.start()
        rc = proc.wait()
    request.unlink(missing_ok=True)
    if rc < 0:  # the child died by a signal before torchrun handled it (e.g. a SIGTERM
        rc = 128 - rc  # as it started): report it the shell's way, 128 + signum
    sweep()
    reader.join()
    result = _read_result(result_path, rc)
    result.received_signal = state.get("signal")
    result.phase = state["phase"]
    if plan.script is not None and rank_logs.started.is_set() and result.phase == "torchrun_start":
        result.phase = SCRIPT_PHASE
    result.peak_rss = dict(sampler.peak_rss)
    result.stall = watch.verdict
    if "stopped_at" in state:
        result.stopped_at = float(state["stopped_at"])
    for failure in result.failures:
        failure.printed = printed_exception(list(rank_logs.stderr_tail.get(failure.local_rank, ())))
    for worker in result.workers:
        worker.last_line = last_words(list(rank_logs.stderr_tail.get(worker.local_rank, ())))
    return result


SCRIPT_PHASE = "script"
"""A ``--script`` run's phase once torchrun started its workers: ups sees none inside it."""
