"""The checkpoint contract of a ``--script`` run, on ups's side (``ups.ckpt`` is the
script's side; docs/script.md).

Every rank gets ``UPS_CHECKPOINT_DIR`` and ``UPS_RESUME``: the newest committed checkpoint
there when the attempt starts, or empty. The outcome's ``resumed_from`` says which one,
or that a continued run started the script from the beginning.

With ``checkpoint_sync`` (the run file's bucket), node 0's launch carries the checkpoints
the way rank 0 of the trainer does (``ups.bucket.uploader``): before the first attempt
the bucket's newest checkpoint of this run id is restored into the directory when it is
not there (a new host), and while the script runs its newest committed checkpoint is
uploaded as it appears.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from ups import ckpt, jsonio
from ups.bucket import Bucket, BucketError
from ups.bucket.checkpoints import fetch_script_checkpoint, newest_script_checkpoint
from ups.bucket.uploader import OUTPUTS_FILE, Uploader
from ups.fsio import atomic_write_text
from ups.launch.plan import LaunchPlan
from ups.log import get_logger

log = get_logger("checkpoint_sync")

POLL_S = 2.0
"""How often the uploader looks for a newer committed checkpoint of a script."""
KEEP_LAST = 1
"""A script run keeps its newest checkpoint in the bucket: the one a new host resumes from."""
FINAL_SYNC_S = 300.0
"""The last pass after the run ended (``checkpoint_sync.flush_timeout_s``'s default)."""


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


def bucket(plan: LaunchPlan) -> Bucket | None:
    """A script run's bucket, on node 0 (the one that holds the checkpoints)."""
    if plan.checkpoint_sync_url is None or plan.node_rank != 0 or checkpoint_dir(plan) is None:
        return None
    return Bucket.open(plan.checkpoint_sync_url, endpoint_url=plan.checkpoint_sync_endpoint)


def restore(plan: LaunchPlan, store: Bucket) -> str | None:
    """Fetch the bucket's newest checkpoint of this run into the checkpoint directory when
    it is not there; its ``s3://`` address, or None. A bucket that does not answer leaves
    the script to what the directory holds, saying so."""
    directory = checkpoint_dir(plan)
    assert directory is not None  # bucket() opens one only for a script run
    started = time.monotonic()
    try:
        newest = newest_script_checkpoint(store, plan.run_id)
        if newest is None or (directory / newest[0]).exists():
            return None
        path = fetch_script_checkpoint(store, plan.run_id, newest[0], newest[1], directory)
    except BucketError as exc:
        log.warning(
            "checkpoint_fetch_failed",
            error=str(exc),
            message=f"the script resumes from what {directory} holds, if anything",
        )
        return None
    url = store.url_of(f"{plan.run_id}/checkpoints/{path.name}")
    log.info(
        "checkpoint_fetched",
        checkpoint=str(path),
        seconds=round(time.monotonic() - started, 3),
        url=url,
        text=f"restored {path.name} from {url}",
    )
    return url


def uploader(plan: LaunchPlan, store: Bucket) -> Uploader:
    """The thread that uploads the script's newest committed checkpoint and the logs."""
    directory = checkpoint_dir(plan)
    return Uploader(
        store, plan.run_id, Path(plan.run_dir), KEEP_LAST, script_dir=directory, poll_s=POLL_S
    ).start()


def resumed_from(
    plan: LaunchPlan, resume: Path | None, continued: bool, fetched: str | None = None
) -> dict[str, Any] | None:
    """What the outcome says about where the script started (``fetched``: the bucket
    address it was restored from on this host)."""
    directory = checkpoint_dir(plan)
    if directory is None:
        return None
    if resume is not None:
        came = f", restored from {fetched}" if fetched and resume.name in fetched else ""
        return {
            "step": None,
            "checkpoint": str(resume),
            "why": f"UPS_RESUME: the newest committed checkpoint in {directory}{came}",
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


def record_outputs(plan: LaunchPlan) -> dict[str, Any] | None:
    """Write ``<run dir>/script-outputs.json``: the script's files that live outside the run
    directory (its ``checkpoint_dir`` elsewhere, what its ``outputs`` globs match now), as
    paths relative to its workdir (absolute when outside it). ``fab fetch`` and the
    bucket's last pass read it to bring them home. None for the trainer."""
    directory = checkpoint_dir(plan)
    if directory is None:
        return None
    workdir, run_dir = Path(plan.workdir).resolve(), Path(plan.run_dir).resolve()
    found = [directory] if directory.exists() else []
    missing = []
    for pattern in plan.script_outputs:
        matched = sorted(Path(plan.workdir).glob(pattern))
        found += matched
        if not matched:
            missing.append(pattern)
    kept: list[Path] = []
    for path in sorted({p.resolve() for p in found}):
        if path == run_dir or run_dir in path.parents:
            continue  # in the run directory: it comes home with it
        if any(k == path or k in path.parents for k in kept):
            continue  # inside a directory already listed
        kept.append(path)
    record = {
        "workdir": str(workdir),
        "paths": [os.path.relpath(p, workdir) if workdir in p.parents else str(p) for p in kept],
        "missing": missing,
    }
    try:
        atomic_write_text(run_dir / OUTPUTS_FILE, jsonio.dumps(record, indent=2) + "\n")
    except OSError as exc:  # a full disk: the outputs stay on the host, and it says so
        log.warning("outputs_not_recorded", error=str(exc), path=str(run_dir / OUTPUTS_FILE))
    return record
