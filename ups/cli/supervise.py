"""``ups supervise RUN_ID``: follow a managed run (any provider), sync its checkpoints,
recover it when its instance is lost. A detached ``fab deploy`` starts it in the background;
started by hand (on any machine with the run directory), it picks the run up where it is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="ups supervise",
        description="Supervise a managed run from runs/<id>/supervision.json: follow it, sync "
        "its checkpoints, recover it on a new instance when its instance is lost.",
    )
    p.add_argument("run_id", help="the run's id (a directory under --runs-dir)")
    p.add_argument("--runs-dir", default="runs", help="local runs directory (default: runs)")
    args = p.parse_args(argv)
    from ups.deploy import tasks
    from ups.deploy.managed.ops import supervise

    return tasks.guarded(lambda: supervise(args.run_id, Path(args.runs_dir), sys.stdout))
