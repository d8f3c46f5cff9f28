"""``checkpoint_sync`` in the trainer: rank 0 fetches a newer checkpoint before resuming
and starts the uploader; at the end it flushes within a bound and says what is missing."""

from __future__ import annotations

import time
from pathlib import Path

from ups.bucket import Bucket, BucketError, fetch_checkpoint, newest_checkpoint
from ups.bucket.checkpoints import local_checkpoints
from ups.bucket.uploader import SyncReport, Uploader
from ups.config import Config
from ups.log import get_logger
from ups.outcome import Outcome

log = get_logger("checkpoint_sync")


def fetch_newer(bucket: Bucket, run_id: str, checkpoints: Path) -> Path | None:
    """Rank 0, before resuming: when the bucket's newest committed checkpoint of this run is
    newer than every one in ``checkpoints`` (a new host), fetch it there, verified. A bucket
    that does not answer leaves the run to the local checkpoints, saying so."""
    started = time.monotonic()
    try:
        ref = newest_checkpoint(bucket, run_id)
        local = local_checkpoints(checkpoints)
        if ref is None or (local and local[-1][0] >= ref.step):
            return None
        path = fetch_checkpoint(bucket, ref, checkpoints)
    except BucketError as exc:
        log.warning(
            "checkpoint_fetch_failed",
            error=str(exc),
            message="resuming from the run directory's own checkpoints, if any",
        )
        return None
    log.info(
        "checkpoint_fetched",
        checkpoint=ref.name,
        step=ref.step,
        seconds=round(time.monotonic() - started, 3),
        url=bucket.url_of(ref.key),
    )
    return path


def start_sync(cfg: Config, run_id: str, run_dir: Path) -> Uploader | None:
    """Rank 0 with ``checkpoint_sync.url``: fetch a newer checkpoint (when resuming), then
    start the uploader; None without a bucket."""
    sync = cfg.checkpoint_sync
    if sync.url is None:
        return None
    bucket = Bucket.open(sync.url, endpoint_url=sync.endpoint_url)
    if cfg.checkpoint.resume and sync.resume:
        fetch_newer(bucket, run_id, run_dir / "checkpoints")
    return Uploader(bucket, run_id, run_dir, cfg.checkpoint.keep_last).start()


def final_sync_timeout(cfg: Config, outcome: Outcome) -> float:
    """The final upload's bound: ``flush_timeout_s``, but within half the stop grace when
    preempted (torchrun SIGKILLs the workers at its end; an upload cut there never counts)."""
    if outcome.outcome == "preempted":
        return min(cfg.checkpoint_sync.flush_timeout_s, cfg.distributed.stop_grace_s / 2)
    return cfg.checkpoint_sync.flush_timeout_s


def flush_checkpoints(uploader: Uploader, timeout: float) -> SyncReport:
    """Wait (at most ``timeout``) for the checkpoints to reach the bucket; log the verdict."""
    report = uploader.flush(timeout)
    if report.complete and not report.pending:
        log.info("checkpoint_sync_flushed", url=report.url, uploaded=report.uploaded)
    else:
        log.warning(
            "checkpoint_sync_incomplete",
            url=report.url,
            pending=report.pending,
            error=report.error,
            message="these checkpoints are on this host only; the next attempt of this run "
            "id uploads them first thing",
        )
    return report
