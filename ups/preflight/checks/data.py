"""Data: every HDF5 file of the config opens with its layout's keys and shapes.

Uses the trainer's own reader (``ups.data.pdebench.inspect_task``), so preflight and
training can never disagree about what a valid file is.
"""

from __future__ import annotations

from typing import Any

from ups.data.pdebench import DataError, inspect_task
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status


def run(ctx: Context) -> CheckResult:
    if ctx.cfg is None:
        return CheckResult(
            name="data",
            status=Status.SKIP,
            message="no valid run config, so no data files to check",
            hint="ups-preflight --config CONFIG.yaml",
        )
    problems: list[str] = []
    tasks: dict[str, Any] = {}
    for task in ctx.cfg.tasks:
        try:
            info = inspect_task(task)
        except DataError as exc:
            problems.append(f"{task.name}: {exc}")
            tasks[task.name] = {"path": str(task.path), "ok": False, "error": str(exc)}
            continue
        tasks[task.name] = {
            "path": str(task.path),
            "ok": True,
            "samples": info.n_samples,
            "frames": info.n_frames,
            "spatial": list(info.spatial),
            "channels": info.channels,
        }
    n = len(ctx.cfg.tasks)
    if problems:
        return CheckResult(
            name="data",
            status=Status.FAIL,
            message=f"{len(problems)} of {n} data file(s) unusable: " + " | ".join(problems),
            value=n - len(problems),
            threshold=n,
            unit="files",
            hint="regenerate the demo data with `ups data synth`, re-download the PDEBench "
            "file, or fix tasks[].path/layout in the config (details per task above)",
            details={"tasks": tasks},
        )
    samples = sum(t["samples"] for t in tasks.values())
    return CheckResult(
        name="data",
        status=Status.PASS,
        message=f"{n} data file(s) match their layouts ({samples} samples in all)",
        value=n,
        threshold=n,
        unit="files",
        details={"tasks": tasks},
    )
