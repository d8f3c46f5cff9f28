"""The run directory: create it and point ``<output_dir>/latest`` at it."""

from __future__ import annotations

import os
from pathlib import Path

LATEST = "latest"


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run directory and its ``logs/`` (the trainer adds the rest)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)


def point_latest(run_dir: Path) -> Path:
    """Atomically repoint ``<output_dir>/latest`` to ``run_dir`` (a relative link).

    The link is replaced with a rename, so a reader following ``latest`` (``fab logs``)
    sees the old run or the new one, never a missing link.
    """
    link = run_dir.parent / LATEST
    tmp = run_dir.parent / f".{LATEST}.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name, target_is_directory=True)
    os.replace(tmp, link)
    return link
