"""Decide the run's final ``outcome.json`` and ``ups launch``'s exit code after torchrun ends.

The trainer's rank 0 writes the outcome on finished, preempted and most failures. A
worker that died without writing one (segfault, SIGKILL, a bare ``--script``) leaves
only torchrun's view, so launch writes or amends the outcome from that: the failed
rank, its signal and exit code, and where its traceback is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ups import ckpt
from ups.launch.oom import MemorySnapshot, explain_sigkill, kernel_log_oom_kills, snapshot
from ups.launch.plan import LaunchPlan
from ups.launch.scriptrun import checkpoint_dir
from ups.launch.torchrun import (
    PEER_LOST,
    TorchrunResult,
    WorkerExit,
    WorkerFailure,
    blame_order,
    received,
)
from ups.log import get_logger
from ups.outcome import (
    EXIT_CONFIG,
    EXIT_NONFINITE,
    EXIT_PREEMPTED,
    EXIT_SAVE_FAILED,
    OUTCOME_FILE,
    Outcome,
    read_outcome,
    write_outcome,
)
from ups.worker_death import LOADER_DIED, worker_death

log = get_logger("ups.launch")

PREVIOUS_OUTCOME = "outcome.previous.json"


def set_aside_previous_outcome(run_dir: Path) -> Path | None:
    """Move an outcome left by an earlier attempt (a resumed run id) out of the way.

    Without this, a resumed run that segfaults would be reported with the old run's
    "preempted" or "finished".
    """
    path = run_dir / OUTCOME_FILE
    if not path.exists():
        return None
    target = run_dir / PREVIOUS_OUTCOME
    path.replace(target)
    return target


def _traceback_location(plan: LaunchPlan, failure: WorkerFailure | WorkerExit) -> str:
    if isinstance(failure, WorkerFailure) and failure.error_file:
        return failure.error_file
    rank_log = Path(plan.run_dir) / "logs" / f"rank{failure.rank}.jsonl"
    if rank_log.exists():  # the trainer's log: its rank_failed event holds the traceback
        return str(rank_log)
    return plan.log_path  # a script's rank: what it printed, torchrun's summary


def _describe(failure: WorkerFailure) -> str:
    if failure.signal:
        return f"rank {failure.rank} died with {failure.signal} (exit code {failure.exitcode})"
    if (death := worker_death(failure.message)) is not None:
        return f"rank {failure.rank} exited with code {failure.exitcode}: its {death.describe()}"
    first = failure.message.strip().splitlines()[0] if failure.message.strip() else ""
    if not first or first.startswith("To enable traceback"):  # no @record, no error file
        first = failure.printed or ""  # what the rank printed: its traceback's last line
    detail = f": {first[:200]}" if first else ""
    return f"rank {failure.rank} exited with code {failure.exitcode}{detail}"


def _outcome(plan: LaunchPlan, result: TorchrunResult, **fields: Any) -> Outcome:
    return Outcome(run_id=plan.run_id, world_size=plan.world_size, phase=result.phase, **fields)


def _from_torchrun(plan: LaunchPlan, result: TorchrunResult) -> Outcome:
    """The outcome as torchrun saw the run, for when the trainer left none."""
    if result.received_signal is not None and result.workers:
        stopped = _after_the_stop(plan, result)
        if stopped is not None:
            return stopped
    if result.rc == 0:
        reason = f"all {plan.nproc_per_node} worker(s) on node {plan.node_rank} exited 0"
        warnings = [never_met(plan.world_size)] if _never_met(plan, result) else []
        return _outcome(
            plan, result, outcome="finished", exit_code=0, reason=reason, warnings=warnings
        )
    cause = result.root_cause()
    if cause is not None:
        return _outcome(
            plan,
            result,
            outcome="failed",
            exit_code=result.rc,
            reason=_describe(cause),
            failed_rank=cause.rank,
            signal=cause.signal,
            traceback=_traceback_location(plan, cause),
            cause=_cause_of(cause),
        )
    if result.status == "signal" or result.received_signal:
        sig = result.signal or result.received_signal
        reason = f"ups launch was stopped by {sig} before the workers finished"
        return _outcome(
            plan, result, outcome="failed", exit_code=result.rc, reason=reason, signal=sig,
            cause="stopped",
        )  # fmt: skip
    reason = f"torchrun failed: {result.error or f'exit code {result.rc}'}"
    return _outcome(
        plan, result, outcome="failed", exit_code=result.rc, reason=reason,
        traceback=plan.log_path, cause="launch_error",
    )  # fmt: skip


def _after_the_stop(plan: LaunchPlan, result: TorchrunResult) -> Outcome | None:
    """A stop reached the workers: the outcome from how each of them really ended.

    ``preempted`` only when every rank exited 0 (or 75) after it, naming the checkpoint the
    script committed since, or saying it committed none; else ``failed``, naming the first
    rank that did not, its code or signal and its last line on stderr. For the trainer,
    another node's ranks ending cleanly are "preempted" (rank 0 writes the run's outcome on
    node 0); None on node 0 when rank 0 wrote none though every rank exited cleanly (told
    as before: stopped)."""
    sig = result.received_signal
    assert sig is not None
    unclean = result.unclean()
    node = f"all {len(result.workers)} rank(s) on node {plan.node_rank}"
    if not unclean:
        if plan.script is None and plan.node_rank == 0:
            return None  # the trainer's rank 0 writes the outcome; it left none
        if plan.script is None:
            reason = (
                f"{received(sig)} by ups launch; {node} exited 0 or 75 after the stop (rank 0, "
                "on node 0, writes the run's checkpoint and outcome)"
            )
            return _outcome(
                plan, result, outcome="preempted", exit_code=EXIT_PREEMPTED, reason=reason,
                signal=sig, cause="preempted",
            )  # fmt: skip
        reason = (
            f"{received(sig)} by ups launch; {node} exited 0 after the stop; "
            f"{_committed_since(plan, result.stopped_at)}"
        )
        return _outcome(
            plan, result, outcome="preempted", exit_code=EXIT_PREEMPTED, reason=reason,
            signal=sig, cause="preempted",
        )  # fmt: skip
    first = unclean[0]
    more = f"; {len(unclean) - 1} more rank(s) did not exit 0 either" if len(unclean) > 1 else ""
    said = f"; its last line on stderr: {first.last_line[:200]!r}" if first.last_line else ""
    reason = (
        f"{received(sig)} by ups launch; {first.describe()} after the stop"
        f"{_stop_hint(plan, first)}{said}{more}"
    )
    return _outcome(
        plan, result, outcome="failed", exit_code=result.rc or 128 + 15, reason=reason,
        failed_rank=first.rank, signal=first.signal or sig, cause="stopped",
        traceback=_traceback_location(plan, first),
    )  # fmt: skip


def _stop_hint(plan: LaunchPlan, worker: WorkerExit) -> str:
    if worker.signal == "SIGKILL":
        return (
            f": still running {plan.stop_grace_s} s (stop_grace_s) after the stop, so torchrun "
            "killed it"
        )
    if worker.signal == "SIGTERM" and plan.script is not None:
        return (
            ": the script does not handle SIGTERM; to end `preempted`, save and exit 0 "
            "(docs/script.md)"
        )
    return ""


def _committed_since(plan: LaunchPlan, since: float | None) -> str:
    """Which checkpoint the script committed after the stop, in words, or that it did not."""
    directory = checkpoint_dir(plan)
    newest = ckpt.latest(directory) if directory is not None else None
    if newest is None:
        return "they committed no checkpoint: the same command starts the script again"
    if since is not None and newest.stat().st_mtime < since:
        return (
            f"they committed no checkpoint after it; the newest, {newest}, is from before the stop"
        )
    return f"they committed checkpoint {newest}"


def never_met(world_size: int) -> str:
    """The warning for ranks that ran side by side and never formed a process group."""
    return (
        f"{world_size} ranks ran, none joined a process group: each trained alone on its "
        "own copy (the script never calls torch.distributed.init_process_group, or its "
        "framework was told of one device only)"
    )


def _never_met(plan: LaunchPlan, result: TorchrunResult) -> bool:
    return plan.world_size > 1 and result.store_untouched


def finalize_outcome(
    plan: LaunchPlan, result: TorchrunResult, memory_before: MemorySnapshot | None = None
) -> Outcome:
    """Read the trainer's outcome, write or amend it from torchrun's result, return it."""
    final = _explain_kill(_decide(plan, result), result, memory_before)
    save_outcome(Path(plan.run_dir), final)
    return final


def save_outcome(run_dir: Path, outcome: Outcome) -> bool:
    """Write outcome.json; on a full or failing disk say so and go on (the exit code and
    the console's last line still tell how the run ended)."""
    try:
        write_outcome(run_dir, outcome)
        return True
    except OSError as exc:
        log.error(
            "outcome_not_written",
            text="could not write outcome.json",
            path=str(run_dir / OUTCOME_FILE),
            error=f"{type(exc).__name__}: {exc}",
            fix="free space on that filesystem; the outcome is in this line and the exit code",
            outcome=outcome.outcome,
            reason=outcome.reason,
        )
        return False


def _explain_kill(
    outcome: Outcome, result: TorchrunResult, before: MemorySnapshot | None
) -> Outcome:
    """A rank died by SIGKILL: say whether the OOM killer did it, the limit, the peaks."""
    killed = [f for f in result.failures if f.signal == "SIGKILL"]
    if not killed or before is None or outcome.outcome != "failed":
        return outcome
    victim = next((f for f in killed if f.rank == outcome.failed_rank), None)
    if victim is None:  # the blamed rank died otherwise; torchrun's SIGKILL was the cleanup
        return outcome
    pids = {f.pid for f in killed if f.pid is not None}
    memory = explain_sigkill(
        before, snapshot(), result.peak_rss, victim.rank, kernel_log_oom_kills(pids)
    )
    return dataclasses.replace(outcome, memory=memory, reason=f"{outcome.reason}; {memory['hint']}")


def _decide(plan: LaunchPlan, result: TorchrunResult) -> Outcome:
    run_dir = Path(plan.run_dir)
    written = read_outcome(run_dir)
    seen = _from_torchrun(plan, result)
    if written is None:
        return seen
    final = written
    cause = result.root_cause()
    if written.outcome == "finished" and _finished_before_the_stop(result):
        # The stop reached torchrun after every rank had finished (during the evaluation
        # or the teardown): the work is complete, so the run is "finished", and says so.
        sig = result.received_signal or result.signal
        reason = f"{written.reason}; ups launch received {sig} after every rank had finished"
        final = dataclasses.replace(written, reason=reason)
    elif written.outcome == "finished" and result.rc != 0:
        # A rank crashed after rank 0 reported success (e.g. in teardown): never report
        # "finished" for a run whose exit code says otherwise.
        final = dataclasses.replace(
            seen,
            reason=f"trainer reported finished, but {seen.reason}",
            step=written.step,
            checkpoint=written.checkpoint,
            metrics=written.metrics,
        )
    elif written.outcome == "failed" and cause is not None:
        final = _amend_failed(plan, written, result, cause)
    elif written.outcome == "preempted" and result.received_signal is not None:
        if result.unclean():  # rank 0 wrote "preempted"; another rank did not end cleanly
            final = dataclasses.replace(
                seen, step=written.step, checkpoint=written.checkpoint, metrics=written.metrics
            )
        else:
            final = _named_as_received(written, result.received_signal)
    if final.outcome == "finished" and _never_met(plan, result):
        final = dataclasses.replace(final, warnings=[*final.warnings, never_met(plan.world_size)])
    return final


def _named_as_received(written: Outcome, sig: str | None) -> Outcome:
    """The workers got launch's SIGTERM; the person sent ``sig`` (Ctrl-C: SIGINT), which
    the workers name too (``ups.grace.requested_stop``). The outcome says who received it
    and how people know it, and keeps the trainer's account of the stop after it."""
    assert sig is not None
    _, _, stop = written.reason.partition(" received; ")  # the trainer's "SIGINT received; "
    return dataclasses.replace(
        written, signal=sig, reason=f"{received(sig)} by ups launch; {stop or written.reason}"
    )


def _finished_before_the_stop(result: TorchrunResult) -> bool:
    """torchrun exited non-zero only because it was stopped: no worker failed."""
    stopped = result.status == "signal" or result.received_signal is not None
    return result.rc != 0 and stopped and not result.failures and not result.unclean()


def _amend_failed(
    plan: LaunchPlan, written: Outcome, result: TorchrunResult, cause: WorkerFailure
) -> Outcome:
    """Add what only torchrun saw to the trainer's "failed": the rank, and how it died.

    The trainer's surviving rank knows that a peer died, rarely which one or of what.
    """
    rank = _blamed_rank(written, cause)
    failure = result.failure_of(rank) or cause
    changes: dict[str, Any] = {}
    if written.exit_code in _TRAINER_CODES or written.cause in _AGREED_CAUSES:
        # Every rank stopped together at one agreement (a refused resume, a non-finite
        # loss, a failed save, too many skips): the reason is complete. How torchrun then
        # tore the others down (SIGTERM to the slower rank) would only mislead.
        return written
    if written.failed_rank != rank:
        changes["failed_rank"] = rank
        changes["traceback"] = _traceback_location(plan, failure)
    if written.signal is None and failure.signal and failure.rank == rank:
        changes["signal"] = failure.signal
        changes["reason"] = f"{written.reason}; torchrun: {_describe(failure)}"
    if written.cause == "peer_died" and blame_order(failure) < PEER_LOST:
        # The survivor saw only a broken connection; torchrun saw how the peer ended.
        changes["cause"] = _cause_of(failure)
        if changes["cause"] == LOADER_DIED:
            changes["reason"] = f"{written.reason}; torchrun: {_describe(failure)}"
    if written.traceback is None and "traceback" not in changes:
        changes["traceback"] = _traceback_location(plan, failure)
    return dataclasses.replace(written, **changes) if changes else written


def _blamed_rank(written: Outcome, cause: WorkerFailure) -> int:
    """The trainer's rank, unless it only guessed: a survivor that saw a peer's connection
    drop ("peer_died") names no rank, or the first that had not reached the step, while
    torchrun knows which rank died and of what."""
    if written.failed_rank is None:
        return cause.rank
    if written.cause == "peer_died" and blame_order(cause) < PEER_LOST:
        return cause.rank
    return written.failed_rank


def _cause_of(failure: WorkerFailure) -> str:
    if failure.signal:
        return "rank_signal"
    return LOADER_DIED if worker_death(failure.message) else "exception"


_TRAINER_CODES = (EXIT_CONFIG, EXIT_NONFINITE, EXIT_SAVE_FAILED)
_AGREED_CAUSES = {"config", "nonfinite", "save_failed", "too_many_oom_skips", "oom_in_step"}
"""Causes of a ``RunFailed`` that every rank raised at the same agreement."""


def exit_code(outcome: Outcome, torchrun_rc: int) -> int:
    """torchrun's exit code, except where the run said more: the trainer's own codes
    (preempted 75, bad config 2, non-finite 65, save failed 74) pass through, and a run
    whose outcome is not "finished" never exits 0."""
    if outcome.outcome == "preempted" or outcome.exit_code in _TRAINER_CODES:
        return outcome.exit_code
    if outcome.outcome == "finished" and outcome.exit_code == 0:
        return 0  # _decide keeps "finished" only where no worker failed
    if torchrun_rc != 0:
        return torchrun_rc
    if outcome.outcome != "finished":
        return outcome.exit_code or 1
    return 0
