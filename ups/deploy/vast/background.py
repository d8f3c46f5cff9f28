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
from typing import TextIO

from ups.deploy.errors import UsageError
from ups.deploy.vast import supervision
from ups.runid import run_id_problem

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


def supervise(run_id: str, runs_dir: Path, out: TextIO) -> int:
    """Supervise run ``run_id`` from its saved state, as a followed deploy would."""
    from ups.deploy.hosts import VastHost, get_host
    from ups.deploy.vast import ops

    if problem := run_id_problem(run_id):
        raise UsageError(f"RUN_ID: {problem}.")
    state = supervision.load(runs_dir / run_id)
    if state is None:
        raise UsageError(
            f"no supervised run {run_id!r} in {runs_dir} (no {supervision.FILE}). "
            f"`fab deploy --host HOST --run {run_id} --detach` starts one."
        )
    spec, known_hosts = get_host(state.host, state.hosts_file)
    if not isinstance(spec, VastHost):
        raise UsageError(f"host {state.host!r} of run {run_id} is no longer a vast entry.")
    deploy = ops.plan(
        spec,
        known_hosts,
        Path(state.config),
        out,
        run_id=run_id,
        overrides=tuple(state.overrides),
        follow=True,
        skip_preflight=False,
        mirror=None,
        hosts_file=state.hosts_file,
        mode="detached",
    )
    out.write(deploy.render() + "\n")
    out.flush()
    return deploy.run()
