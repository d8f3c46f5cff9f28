"""Preflight as the gate in front of torchrun: the plan's options in, a verdict out."""

from __future__ import annotations

from dataclasses import dataclass

from ups.config import Config
from ups.launch.plan import LaunchPlan
from ups.preflight.options import PreflightOptions
from ups.preflight.result import Report, Status
from ups.preflight.runner import run_preflight


@dataclass(frozen=True, slots=True)
class GateVerdict:
    ok: bool
    report: Report
    failed: list[str]
    """Names of the checks that stop the launch (fail, or warn under strict)."""


def preflight_options(plan: LaunchPlan, cfg: Config | None, gpu_count: int) -> PreflightOptions:
    """What preflight must check for this plan.

    The port checked is the one the plan chose. A single node picked it itself, so a
    taken port there is only a warning; node 0 of a multi-node run cannot move the
    shared rendezvous port, so there it fails. Other nodes bind nothing.
    """
    return PreflightOptions(
        config=cfg,
        nproc_per_node=plan.nproc_per_node,
        expected_gpus=plan.nproc_per_node if gpu_count > 0 else None,
        master_port=plan.master_port,
        port_fallback=not plan.multi_node,
        skip=[*plan.preflight_skip, *([] if plan.rdzv_host else ["ports"])],
        strict=plan.preflight_strict,
    )


def run_gate(plan: LaunchPlan, cfg: Config | None, gpu_count: int) -> GateVerdict:
    """Run preflight for ``plan``; never raises for an unfit host."""
    report = run_preflight(preflight_options(plan, cfg, gpu_count))
    bad = {Status.FAIL, Status.WARN} if plan.preflight_strict else {Status.FAIL}
    failed = [r.name for r in report.results if r.status in bad]
    return GateVerdict(ok=report.ok(plan.preflight_strict), report=report, failed=failed)
