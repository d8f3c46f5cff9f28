"""The supervisor a detached deploy leaves on this machine: ``ups supervise RUN`` in the
background, in a session of its own (closing the terminal sends it no SIGHUP), its output
in ``runs/<id>/supervisor.log`` and nothing on a terminal that may be gone.

It is the same supervision a followed deploy does (follow the log, sync checkpoints,
recover a lost instance), rebuilt from ``runs/<id>/supervision.json``; its lease makes a
later deploy of the run see it instead of starting a second one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOG = "supervisor.log"


def start(runs_dir: Path, run_id: str) -> int:
    """Start ``ups supervise RUN_ID`` detached from this terminal; return its pid."""
    log_path = runs_dir / run_id / LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ups", "supervise", run_id, "--runs-dir", str(runs_dir)],
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid
