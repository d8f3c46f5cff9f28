"""A real two-node Slurm cluster on this machine (scripts/slurm-setup.sh), once per machine.

The daemons (munged, slurmctld, two slurmd on loopback) run under one directory in the
temp dir and stay up after the tests, like the Docker engine: the first test that needs
them starts them under a file lock, later ones (other xdist workers, later runs) find them
answering. A cluster that stopped answering is stopped and started again.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_fixtures import REPO

SLURM_DIR = Path(tempfile.gettempdir()) / "ups-slurm"
SLURM_CONF = SLURM_DIR / "slurm.conf"


def slurm_env() -> dict[str, str]:
    """This process's environment pointing Slurm's commands at the test cluster."""
    return {**os.environ, "SLURM_CONF": str(SLURM_CONF)}


def slurm(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command (scontrol, squeue, sinfo) against the test cluster."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=slurm_env()
    )


def _answers() -> bool:
    if not SLURM_CONF.exists():
        return False
    try:
        states = slurm("sinfo", "-h", "-N", "-o", "%t", timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    usable = [s for s in states.stdout.split() if s.rstrip("*") in ("idle", "alloc", "mix", "comp")]
    return states.returncode == 0 and len(usable) == 2


def _setup(*args: str) -> None:
    script = REPO / "scripts" / "slurm-setup.sh"
    out = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.fail(f"scripts/slurm-setup.sh {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def _start_once() -> Path:
    from filelock import FileLock

    from tests.background import await_background

    await_background("slurm")  # scripts/test.sh installs Slurm in the background
    with FileLock(str(SLURM_DIR) + ".lock", timeout=900):
        if not _answers():
            _setup("install")
            _setup("stop", str(SLURM_DIR))
            _setup("start", str(SLURM_DIR))
    return SLURM_CONF


def cancel_jobs_under(root: Path) -> list[str]:
    """Cancel every job still queued whose working directory is under ``root``; the ids.
    Jobs of other test runs on the same cluster (another pytest session on this machine,
    as the same user) are left alone."""
    listed = slurm("squeue", "-h", "--user", getpass.getuser(), "-o", "%i|%Z")
    ids = [
        job
        for job, _, workdir in (line.partition("|") for line in listed.stdout.splitlines())
        if workdir and Path(workdir).is_relative_to(root)
    ]
    if ids:
        slurm("scancel", *ids)
    return ids


@pytest.fixture
def slurm_cluster(tmp_path: Path) -> Iterator[Path]:
    """The test cluster's slurm.conf, with both nodes up (fails, never skips, when Slurm
    cannot be installed or started). Every job the test submitted (from a directory under
    its tmp_path) still queued when it ends is cancelled: a failed test leaves no job
    holding the nodes (the slurm tests run on one xdist worker, ``xdist_group("slurm")``),
    and cancels no job of another run sharing the cluster."""
    conf = _start_once()
    try:
        yield conf
    finally:
        cancel_jobs_under(tmp_path)
