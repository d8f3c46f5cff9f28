"""Carry out a :class:`LaunchPlan`: run dir, preflight gate, torchrun, outcome, exit code."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO, cast

import structlog

from ups.config import Config
from ups.launch.finalize import exit_code, finalize_outcome, set_aside_previous_outcome
from ups.launch.plan import LaunchPlan
from ups.launch.runner import handling_stop_signals, run_torchrun
from ups.launch.tee import LineTee
from ups.log import get_logger, setup_logging
from ups.outcome import EXIT_FAILED, Outcome, write_outcome
from ups.rundir import mark_latest

log = get_logger("ups.launch")  # lazy: follows the tee that execute() sets up later


def _setup_logging(plan: LaunchPlan, tee: LineTee) -> None:
    setup_logging(run_id=plan.run_id, console=False, stdout=cast(TextIO, tee))
    # Launch is no rank: say which node agent wrote the line instead.
    structlog.contextvars.unbind_contextvars("rank", "world_size")
    structlog.contextvars.bind_contextvars(node_rank=plan.node_rank)


def _report_end(outcome: Outcome, plan: LaunchPlan, code: int) -> None:
    """The last line launch prints: how the run ended, from outcome.json."""
    extra = {}
    if outcome.outcome == "finished" and code == 0:
        level = log.info
    elif outcome.outcome == "preempted":
        level = log.warning
        extra["resume"] = f"run the same command again (or add --run-id {plan.run_id})"
    else:
        level = log.error
    level(
        f"run {outcome.outcome}",
        outcome=outcome.outcome,
        reason=outcome.reason,
        run_dir=plan.run_dir,
        exit_code=code,
        **extra,
    )


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
    run_dir = Path(plan.run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    set_aside_previous_outcome(run_dir)
    mark_latest(Path(plan.output_dir), run_dir)
    with LineTee(Path(plan.log_path), console or sys.stdout, render=render) as tee:
        _setup_logging(plan, tee)
        try:
            return _gate_and_run(plan, cfg, gpu_count, tee)
        finally:
            structlog.reset_defaults()  # the tee closes with this block


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Before torchrun starts, SIGTERM/SIGINT/SIGHUP end launch cleanly (with an outcome)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise _Stopped(signum)

    with handling_stop_signals(handler):
        yield


def _fail(plan: LaunchPlan, reason: str, code: int, sig: str | None = None) -> int:
    outcome = Outcome(
        run_id=plan.run_id,
        outcome="failed",
        exit_code=code,
        reason=reason,
        world_size=plan.world_size,
        signal=sig,
        traceback=plan.log_path,
    )
    write_outcome(Path(plan.run_dir), outcome)
    _report_end(outcome, plan, code)
    return code


def _gate_and_run(plan: LaunchPlan, cfg: Config | None, gpu_count: int, tee: LineTee) -> int:
    log.info(
        "launch plan",
        run_id=plan.run_id,
        run_dir=plan.run_dir,
        world_size=plan.world_size,
        nproc_per_node=plan.nproc_per_node,
        nnodes=plan.nnodes,
        rdzv_endpoint=plan.rdzv_endpoint,
    )
    if plan.port_note:
        log.warning("master port switched", note=plan.port_note, port=plan.master_port)
    try:
        with _stop_on_signals():
            failed = _preflight(plan, cfg, gpu_count, tee)
    except _Stopped as stop:
        reason = f"ups launch was stopped by {stop} during preflight; torchrun never started"
        return _fail(plan, reason, 128 + stop.signum, str(stop))
    if failed is not None:
        return _fail(plan, "preflight failed: " + ", ".join(failed), EXIT_FAILED)
    try:
        result = run_torchrun(plan, tee)
    except Exception as exc:
        _fail(plan, f"ups launch could not run torchrun: {type(exc).__name__}: {exc}", 1)
        raise
    outcome = finalize_outcome(plan, result)
    code = exit_code(outcome, result.rc)
    _report_end(outcome, plan, code)
    return code


def _preflight(
    plan: LaunchPlan, cfg: Config | None, gpu_count: int, tee: LineTee
) -> list[str] | None:
    """Run the gate; return the failed checks' names, or None when torchrun may start."""
    if not plan.preflight:
        log.warning("preflight skipped (--skip-preflight)")
        return None
    from ups.launch.gate import run_gate  # preflight imports are heavy; only when used

    verdict = run_gate(plan, cfg, gpu_count)
    report, strict = verdict.report, plan.preflight_strict
    tee.write_block(report.render_table(strict), report.renderable(strict))
    return None if verdict.ok else verdict.failed
