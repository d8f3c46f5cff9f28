"""Carry out a :class:`LaunchPlan`: run dir, preflight gate, torchrun attempts, outcome, exit code.

Whatever happens, every process the run started ends with ``ups launch``: launch is a
child subreaper and sweeps its descendants on the way out (``ups.launch.procs``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, cast

import structlog

from ups.backoff import LAUNCH_RESTART
from ups.bucket import Bucket
from ups.bucket.uploader import final_pass, restore_logs
from ups.config import Config
from ups.launch import scriptrun
from ups.launch.finalize import (
    exit_code,
    finalize_outcome,
    save_outcome,
    set_aside_previous_outcome,
)
from ups.launch.oom import snapshot
from ups.launch.plan import LaunchPlan
from ups.launch.ports import release, reserve_port
from ups.launch.procs import become_subreaper, sweep
from ups.launch.scriptrun import newest, resumed_from, with_resume
from ups.launch.tee import LineTee
from ups.launch.torchrun import TorchrunResult, handling_stop_signals, run_torchrun
from ups.log import get_logger, setup_logging
from ups.outcome import EXIT_FAILED, Outcome, read_outcome
from ups.retry import resume_hint, retry_verdict
from ups.rundir import LAUNCH_PID, mark_latest, newest_checkpoint, record_launch

log = get_logger("ups.launch")  # lazy: follows the tee that execute() sets up later


def _setup_logging(plan: LaunchPlan, tee: LineTee) -> None:
    setup_logging(run_id=plan.run_id, console=False, stdout=cast(TextIO, tee))
    # Launch is no rank: say which node agent wrote the line instead.
    structlog.contextvars.unbind_contextvars("rank", "world_size")
    structlog.contextvars.bind_contextvars(node_rank=plan.node_rank)


def _report_end(outcome: Outcome, plan: LaunchPlan, code: int) -> None:
    """The last line launch prints: how the run ended, from outcome.json."""
    extra: dict[str, Any] = {}
    if outcome.outcome == "finished" and code == 0:
        level = logging.INFO
    else:
        level = logging.WARNING if outcome.outcome == "preempted" else logging.ERROR
        retryable, _ = retry_verdict(outcome)
        if retryable and outcome.outcome != "finished":
            extra["resume"] = _resume_hint(plan, outcome)
    if outcome.resumed_from is not None and plan.script is not None:
        extra["resumed_from"] = outcome.resumed_from
    for warning in outcome.warnings:
        log.warning("run_warning", text=warning)
    if outcome.warnings:
        extra["warnings"] = outcome.warnings
    log.log(
        level,
        "run_ended",
        text=f"run {outcome.outcome}",
        outcome=outcome.outcome,
        reason=outcome.reason,
        cause=outcome.cause,
        phase=outcome.phase,
        run_dir=plan.run_dir,
        exit_code=code,
        **extra,
    )


def _resume_hint(plan: LaunchPlan, outcome: Outcome) -> str:
    if plan.script is not None:
        return resume_hint(script=True, checkpoint=outcome.checkpoint)
    # The run dir's own: an outcome launch wrote (a rank killed, a stop before training)
    # names none, and the next launch resumes from whatever is there (ups.rundir).
    newest = newest_checkpoint(Path(plan.run_dir))
    return resume_hint(checkpoint=str(newest[1]) if newest else None)


def _try(what: str, action: Callable[[], object], console: TextIO) -> None:
    """Launch's own bookkeeping files: a full disk is reported, never a traceback."""
    try:
        action()
    except OSError as exc:
        console.write(f"ups launch: could not {what}: {type(exc).__name__}: {exc}\n")


def execute(
    plan: LaunchPlan,
    cfg: Config | None,
    *,
    gpu_count: int,
    console: TextIO | None = None,
    render: bool | None = None,
) -> int:
    """Run the plan and return the process exit code (see ``finalize.exit_code``).

    ``render``: show the output for people (progress line, tables) instead of raw lines;
    default: when the console is a terminal. launch.log gets the raw lines either way.
    """
    out = console or sys.stdout
    run_dir = Path(plan.run_dir)
    continued = (run_dir / LAUNCH_PID).exists()  # this run id was launched before
    become_subreaper()
    _try(
        "create the run directory",
        lambda: (run_dir / "logs").mkdir(parents=True, exist_ok=True),
        out,
    )
    _try("set aside the previous outcome", lambda: set_aside_previous_outcome(run_dir), out)
    _try("update latest", lambda: mark_latest(Path(plan.output_dir), run_dir), out)
    _try("write launch.pid", lambda: record_launch(run_dir), out)
    with LineTee(Path(plan.log_path), out, render=render) as tee:
        _setup_logging(plan, tee)
        try:
            with _stop_on_signals():  # between the phases that handle signals themselves
                return _gate_and_run(plan, cfg, gpu_count, tee, continued)
        except _Stopped as stop:
            ended = read_outcome(run_dir)  # this attempt's: the one before was set aside
            if ended is not None and ended.outcome in ("preempted", "finished"):
                # The run had ended (a stop asked of it already: Slurm's srun ends a step on
                # another node's 75; a second Ctrl-C): how it ended stands, not the signal.
                log.warning(
                    "wrap_up_stopped",
                    text=f"{stop} arrived while ups launch wrapped up the run, which had "
                    f"already ended {ended.outcome} (exit {ended.exit_code}): that stands",
                    signal=str(stop),
                )
                _report_end(ended, plan, ended.exit_code)
                return ended.exit_code
            reason = f"ups launch was stopped by {stop} while it wrapped up the run"
            return _fail(plan, reason, 128 + stop.signum, cause="stopped", phase="launch")
        finally:
            sweep()  # the preflight workers or ranks a signal or an error left behind
            structlog.reset_defaults()  # the tee closes with this block


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Outside torchrun, SIGTERM/SIGINT/SIGHUP end launch cleanly (with an outcome)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise _Stopped(signum)

    with handling_stop_signals(handler):
        yield


def _fail(
    plan: LaunchPlan, reason: str, code: int, *, cause: str, phase: str, sig: str | None = None
) -> int:
    outcome = Outcome(
        run_id=plan.run_id,
        outcome="failed",
        exit_code=code,
        reason=reason,
        world_size=plan.world_size,
        signal=sig,
        traceback=plan.log_path,
        cause=cause,
        phase=phase,
    )
    save_outcome(Path(plan.run_dir), outcome)
    _report_end(outcome, plan, code)
    return code


def _announce(plan: LaunchPlan) -> None:
    log.info(
        "launch_plan",
        text="launch plan",
        run_id=plan.run_id,
        run_dir=plan.run_dir,
        world_size=plan.world_size,
        nproc_per_node=plan.nproc_per_node,
        nnodes=plan.nnodes,
        rdzv_endpoint=plan.rdzv_endpoint,
        stop_grace_s=plan.stop_grace_s,
        max_restarts=plan.max_restarts,
    )
    if plan.resume is not None:
        r = plan.resume
        text = (
            f"resuming run {r['run_id']} from step {r['step']}: it ended unfinished ({r['why']})"
            if r["step"] is not None
            # a script's: its outcome's reason is in `why`, often naming the checkpoint again
            else f"resuming run {r['run_id']}: the script gets UPS_RESUME={r['checkpoint']}"
            if r["checkpoint"]
            else f"resuming run {r['run_id']}: no committed checkpoint, so the script starts "
            "from its beginning"
        )
        log.warning(
            "resuming_run",
            text=text,
            run_id=r["run_id"],
            step=r["step"],
            why=r["why"],
            checkpoint=r["checkpoint"],
            fresh_instead="add --fresh to start a new run",
        )
    elif plan.resume_note:
        log.info("new_run", text=f"new run {plan.run_id}: {plan.resume_note}", run_id=plan.run_id)
    if plan.port_note:  # information: the run goes on, on a port nobody else holds
        log.info(
            "master_port_switched",
            text="master port switched",
            note=plan.port_note,
            port=plan.master_port,
        )


def _gate_and_run(
    plan: LaunchPlan, cfg: Config | None, gpu_count: int, tee: LineTee, continued: bool
) -> int:
    _announce(plan)
    try:
        with _stop_on_signals():
            failed = _preflight(plan, cfg, gpu_count, tee)
    except _Stopped as stop:
        reason = f"ups launch was stopped by {stop} during preflight; torchrun never started"
        return _fail(
            plan, reason, 128 + stop.signum, cause="stopped", phase="preflight", sig=str(stop)
        )
    if failed is not None:
        reason = "preflight failed: " + ", ".join(failed)
        return _fail(plan, reason, EXIT_FAILED, cause="preflight", phase="preflight")
    return _attempts(plan, cfg, tee, continued)


def _sync_run_end(plan: LaunchPlan, cfg: Config | None) -> None:
    """With ``checkpoint_sync.url``: the final outcome is launch's (it amends a dead
    worker's), and a worker that died took its uploader with it, so one last pass sends
    what the bucket still lacks, with the outcome, the logs and W&B."""
    if (store := scriptrun.bucket(plan)) is not None:
        final_pass(
            store,
            plan.run_id,
            Path(plan.run_dir),
            scriptrun.KEEP_LAST,
            timeout=scriptrun.FINAL_SYNC_S,
            script_dir=scriptrun.checkpoint_dir(plan),
        )
        return
    if cfg is None or (bucket := _run_bucket(plan, cfg)) is None:
        return
    final_pass(bucket, plan.run_id, Path(plan.run_dir), cfg.checkpoint.keep_last,
               timeout=cfg.checkpoint_sync.flush_timeout_s)  # fmt: skip


def _attempt_record(n: int, started: str, outcome: Outcome) -> dict[str, Any]:
    return {
        "attempt": n,
        "started": started,
        "ended": outcome.time,
        "outcome": outcome.outcome,
        "exit_code": outcome.exit_code,
        "cause": outcome.cause,
        "step": outcome.step,
        "reason": outcome.reason,
        "memory": outcome.memory,
    }


def _restart_delay(
    plan: LaunchPlan, outcome: Outcome, result: TorchrunResult, used: int
) -> float | None:
    """Seconds to wait before an in-place restart, or None when there is none to make."""
    retryable, _ = retry_verdict(outcome)
    if outcome.outcome != "failed" or not retryable or outcome.cause == "stopped":
        return None
    if result.received_signal is not None or used >= plan.max_restarts:
        return None
    return LAUNCH_RESTART.with_(first=plan.restart_backoff_s).delay(used)


MAX_PORT_SWITCHES = 3
"""Fresh master ports tried when another process takes the planned one before torchrun."""


def _run_on_a_free_port(
    plan: LaunchPlan, tee: LineTee, attempt: int
) -> tuple[LaunchPlan, TorchrunResult]:
    """run_torchrun, again on a fresh port while the store's port turns out to be taken;
    returns the plan as it ran (later restarts keep its port) and how torchrun ended.

    ``ups.launch.ports`` keeps other launches off the planned port, but any process can
    bind it between the check and torchrun's agent binding its store. The agent fails
    then before any worker starts, so nothing has run yet and another port is safe.
    """
    for switch in range(MAX_PORT_SWITCHES + 1):
        result = run_torchrun(plan, tee, attempt=attempt)
        if result.status != "port_in_use" or plan.port_fixed or switch == MAX_PORT_SWITCHES:
            return plan, result
        taken = plan.master_port
        port = reserve_port(0)
        release(taken)
        note = (
            f"port {taken} was taken by another process after it was checked; "
            f"using free port {port}"
        )
        plan = plan.with_master_port(port, note)
        log.info(
            "master_port_switched",
            text="master port switched",
            note=note,
            port=port,
            previous_port=taken,
        )
    raise AssertionError("unreachable: the loop returns on its last switch")


def _port_taken_reason(plan: LaunchPlan) -> str:
    port = plan.master_port
    why = (
        "it is the shared --rdzv-endpoint, so it cannot move"
        if plan.port_fixed
        else f"and so were {MAX_PORT_SWITCHES} fresh ports after it"
    )
    return (
        f"torchrun could not bind master port {port}: another process holds it ({why}); "
        f"see who with `ss -ltnp 'sport = :{port}'`, stop it or choose another port"
    )


def _run_bucket(plan: LaunchPlan, cfg: Config | None) -> Bucket | None:
    """The run's bucket, on node 0: the script's ``checkpoint_sync`` or the config's."""
    if (store := scriptrun.bucket(plan)) is not None:
        return store
    if cfg is None or (url := cfg.checkpoint_sync.url) is None or plan.node_rank != 0:
        return None
    return Bucket.open(url, endpoint_url=cfg.checkpoint_sync.endpoint_url)


def _attempts(plan: LaunchPlan, cfg: Config | None, tee: LineTee, continued: bool) -> int:
    """A script's checkpoints to and from its bucket around :func:`_attempts_of`; on a new
    host, the ranks' logs so far from the run's bucket first (they continue, whole)."""
    if (run_bucket := _run_bucket(plan, cfg)) is not None:
        restore_logs(run_bucket, plan.run_id, Path(plan.run_dir))
    store = scriptrun.bucket(plan)
    if store is None:
        return _attempts_of(plan, cfg, tee, continued, None)
    fetched = scriptrun.restore(plan, store)
    sync = scriptrun.uploader(plan, store)
    try:
        return _attempts_of(plan, cfg, tee, continued, fetched, stop_sync=sync.stop)
    finally:
        sync.stop()


def _attempts_of(
    plan: LaunchPlan,
    cfg: Config | None,
    tee: LineTee,
    continued: bool,
    fetched: str | None,
    stop_sync: Callable[[], None] | None = None,
) -> int:
    """torchrun, then again from the last checkpoint while the budget and the cause allow."""
    records: list[dict[str, Any]] = []
    first_resume: Path | None = None
    while True:
        started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        before = snapshot()
        plan, resume = with_resume(plan)  # a script's UPS_RESUME, as of this attempt
        if not records:
            first_resume = resume
        try:
            plan, result = _run_on_a_free_port(plan, tee, attempt=len(records) + 1)
        except _Stopped as stop:  # before torchrun took the signals over: it was starting
            reason = f"ups launch was stopped by {stop} while torchrun was starting"
            return _fail(
                plan, reason, 128 + stop.signum, cause="stopped", phase="torchrun_start",
                sig=str(stop),
            )  # fmt: skip
        except Exception as exc:
            reason = f"ups launch could not run torchrun: {type(exc).__name__}: {exc}"
            _fail(plan, reason, 1, cause="launch_error", phase="torchrun_start")
            raise
        if result.status == "port_in_use":
            reason = _port_taken_reason(plan)
            return _fail(plan, reason, EXIT_FAILED, cause="launch_error", phase="torchrun_start")
        outcome = finalize_outcome(plan, result, before)
        records.append(_attempt_record(len(records) + 1, started, outcome))
        delay = _restart_delay(plan, outcome, result, len(records) - 1)
        if delay is None:
            break
        log.warning(
            "torchrun_restarting",
            text=f"attempt {len(records)} failed ({outcome.cause}); restarting torchrun from "
            f"the last checkpoint in {delay:g} s (restart {len(records)} of {plan.max_restarts})",
            reason=outcome.reason,
        )
        try:
            with _stop_on_signals():
                time.sleep(delay)  # backoff; a stop signal here ends the run instead
        except _Stopped as stop:
            outcome = dataclasses.replace(
                outcome,
                reason=f"{outcome.reason}; ups launch was stopped by {stop} before restarting",
                cause="stopped",
                signal=str(stop),
                exit_code=128 + stop.signum,
            )
            result.rc = outcome.exit_code
            break
        set_aside_previous_outcome(Path(plan.run_dir))
    final = dataclasses.replace(outcome, restarts=len(records) - 1, attempts=records)
    if plan.script is not None:
        final = dataclasses.replace(
            final,
            checkpoint=newest(plan),
            resumed_from=resumed_from(plan, first_resume, continued, fetched),
        )
        scriptrun.record_outputs(plan)
    save_outcome(Path(plan.run_dir), final)
    if stop_sync is not None:
        stop_sync()  # the final pass below sends what it had not, with the outcome
    _sync_run_end(plan, cfg)  # before the summary, so that stays the last thing shown
    code = exit_code(final, result.rc)
    _report_end(final, plan, code)
    return code


def _preflight(
    plan: LaunchPlan, cfg: Config | None, gpu_count: int, tee: LineTee
) -> list[str] | None:
    """Run the gate; return the failed checks' names, or None when torchrun may start."""
    if not plan.preflight:
        if plan.preflight_passed_by:
            log.info("preflight_passed_before_launch", by=plan.preflight_passed_by)
        else:
            log.warning("preflight_skipped", text="preflight skipped (--skip-preflight)")
        return None
    from ups.launch.gate import run_gate  # preflight imports are heavy; only when used

    verdict = run_gate(plan, cfg, gpu_count)
    report, strict = verdict.report, plan.preflight_strict
    tee.write_block(report.render_table(strict), report.renderable(strict))
    return None if verdict.ok else verdict.failed
