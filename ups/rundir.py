"""Where a run lives on disk, and which run a command continues."""

from __future__ import annotations

import os
from pathlib import Path

from ups.fsio import atomic_symlink
from ups.outcome import read_outcome
from ups.runid import new_run_id

LATEST = "latest"


def resumable_latest(output_dir: Path, name: str) -> str | None:
    """The run id behind ``<output_dir>/latest`` when that run was preempted and has this name.

    This is what makes "run the same command again" continue a preempted run.
    """
    link = output_dir / LATEST
    try:
        target = link.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        return None
    outcome = read_outcome(target)
    if outcome is None or outcome.outcome != "preempted" or not target.name.startswith(name):
        return None
    return target.name


def resolve_run_id(output_dir: Path, name: str, explicit: str | None = None) -> str:
    """Explicit id (config or ``--run-id``) > ``$UPS_RUN_ID`` > preempted latest > a new id."""
    return (
        explicit
        or os.environ.get("UPS_RUN_ID")
        or resumable_latest(output_dir, name)
        or new_run_id(name)
    )


def mark_latest(output_dir: Path, run_dir: Path) -> None:
    """Point ``<output_dir>/latest`` at ``run_dir`` (atomically replacing the old link)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_symlink(output_dir / LATEST, run_dir.resolve().relative_to(output_dir.resolve()))
