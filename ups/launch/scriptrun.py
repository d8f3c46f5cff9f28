"""The checkpoint contract of a ``--script`` run, on ups's side (``ups.ckpt`` is the
script's side; docs/script.md).

Every rank gets ``UPS_CHECKPOINT_DIR`` and ``UPS_RESUME``: the newest committed checkpoint
there when the attempt starts, or empty. The outcome's ``resumed_from`` says which one,
or that a continued run started the script from the beginning.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ups import ckpt
from ups.launch.plan import LaunchPlan


def checkpoint_dir(plan: LaunchPlan) -> Path | None:
    """The script's checkpoint directory, or None for the bundled trainer."""
    value = plan.env.get(ckpt.ENV_DIR)
    return Path(value) if value else None


def with_resume(plan: LaunchPlan) -> tuple[LaunchPlan, Path | None]:
    """The plan whose workers get ``UPS_RESUME`` as of now, and that checkpoint."""
    directory = checkpoint_dir(plan)
    if directory is None:
        return plan, None
    directory.mkdir(parents=True, exist_ok=True)
    newest = ckpt.latest(directory)
    env = {**plan.env, ckpt.ENV_RESUME: str(newest) if newest else ""}
    return dataclasses.replace(plan, env=env), newest


def resumed_from(plan: LaunchPlan, resume: Path | None, continued: bool) -> dict[str, Any] | None:
    """What the outcome says about where the script started."""
    directory = checkpoint_dir(plan)
    if directory is None:
        return None
    if resume is not None:
        return {
            "step": None,
            "checkpoint": str(resume),
            "why": f"UPS_RESUME: the newest committed checkpoint in {directory}",
        }
    if continued:
        return {
            "step": None,
            "checkpoint": None,
            "why": f"restarted from the start: no committed checkpoint in {directory}",
        }
    return None


def newest(plan: LaunchPlan) -> str | None:
    """The newest committed checkpoint now (the outcome's ``checkpoint``)."""
    directory = checkpoint_dir(plan)
    found = ckpt.latest(directory) if directory is not None else None
    return str(found) if found else None
