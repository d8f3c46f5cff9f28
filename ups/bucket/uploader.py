"""Rank 0's background uploader: the run directory follows into the bucket, training never waits.

After each checkpoint commit the trainer calls :meth:`Uploader.notify` (it only wakes a
thread). The thread then makes the bucket match the run directory: every committed local
checkpoint the bucket lacks goes up newest first (data, then its digest or manifest),
``keep_last`` is applied in the bucket, and the logs that changed follow. Each pass starts
from what is on disk and in the bucket, so a pass that failed midway (the endpoint went
away) is simply made again later, under ``ups.backoff.BUCKET_SYNC``; whether a failure is
worth another try is ``ups.retry.bucket_retryable``'s call. Nothing half-uploaded counts:
a checkpoint exists in the bucket only once its commit object does.

At the end of the run :meth:`Uploader.flush` waits, at most ``flush_timeout_s``, for a
pass that started after the request to complete, and says what is still missing.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ups import ckpt
from ups.backoff import BUCKET_SYNC, Policy
from ups.bucket.checkpoints import (
    commit_bytes,
    local_checkpoints,
    prune,
    upload_checkpoint,
    upload_script_checkpoint,
)
from ups.bucket.store import Bucket, BucketError, CredentialsLapsed
from ups.log import get_logger
from ups.retry import bucket_retryable

log = get_logger("checkpoint_sync")

OUTPUTS_FILE = "script-outputs.json"
"""In a script's run directory: its files outside it (``ups.launch.scriptrun.record_outputs``)."""
RUN_FILES = ("outcome.json", "outcome.previous.json", OUTPUTS_FILE)
"""Files of the run directory uploaded by the final pass (the logs follow on every pass)."""


@dataclass
class SyncReport:
    """What the bucket holds of the run when the report is made (``outcome.json``'s
    ``checkpoint_sync``)."""

    url: str
    uploaded: list[str] = field(default_factory=list)
    """Checkpoints this process uploaded, oldest first."""
    pending: list[str] = field(default_factory=list)
    """Committed local checkpoints not (yet) in the bucket."""
    complete: bool = False
    """The last pass asked for finished: the bucket matched the run directory."""
    error: str | None = None
    """The last failure, when the last pass did not complete."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "uploaded": self.uploaded,
            "pending": self.pending,
            "complete": self.complete,
            "error": self.error,
        }


class Uploader:
    """One thread that keeps ``<bucket>/<run_id>/`` in step with ``run_dir``."""

    def __init__(
        self,
        bucket: Bucket,
        run_id: str,
        run_dir: Path,
        keep_last: int,
        *,
        policy: Policy = BUCKET_SYNC,
        script_dir: Path | None = None,
        poll_s: float | None = None,
    ) -> None:
        self.bucket, self.run_id, self.run_dir = bucket, run_id, run_dir
        self.keep_last, self.policy = keep_last, policy
        self.script_dir = script_dir
        """A ``--script`` run's ``UPS_CHECKPOINT_DIR``: its newest committed checkpoint
        (``ups.ckpt``'s rules) goes up instead of the trainer's ``checkpoints/``."""
        self.poll_s = poll_s
        """Make a pass this often unasked (a script does not call :meth:`notify`)."""
        self._digests: dict[str, tuple[int, int, str]] = {}
        self._cond = threading.Condition()
        self._requested = 1  # the first pass catches up with what a resumed run has
        self._completed = 0
        self._stopping = False
        self._run_files = False
        self._error: str | None = None
        self._gave_up = False
        self._known: dict[str, bytes] = {}
        """Checkpoint name -> commit object this process knows the bucket holds."""
        self._uploaded: list[str] = []
        self._sent_logs: dict[str, tuple[int, int]] = {}
        self._thread = threading.Thread(target=self._loop, name="checkpoint-sync", daemon=True)

    @property
    def url(self) -> str:
        return self.bucket.url_of(self.run_id)

    def start(self, *, announce: bool = True) -> Uploader:
        self._thread.start()
        if announce:
            log.info("checkpoint_sync_started", url=self.url, keep_last=self.keep_last)
        return self

    def notify(self) -> None:
        """A checkpoint was committed: upload it when the thread gets to it (never blocks)."""
        with self._cond:
            self._requested += 1
            self._cond.notify_all()

    def include_run_files(self) -> None:
        """From the next pass on, also upload the outcome and the W&B directory."""
        with self._cond:
            self._run_files = True
        self.notify()

    def flush(self, timeout: float) -> SyncReport:
        """Ask for a pass and wait until one that started after this call completes (or
        ``timeout`` runs out, or the uploader gave up); report what the bucket holds."""
        with self._cond:
            self._requested += 1
            target = self._requested
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._completed >= target or self._gave_up or not self._thread.is_alive(),
                timeout=timeout,
            )
            complete = self._completed >= target
            pending = self._pending()
            return SyncReport(
                url=self.url,
                uploaded=list(self._uploaded),
                pending=pending,
                complete=complete,
                error=None if complete else (self._error or f"not finished within {timeout:g} s"),
            )

    def stop(self) -> None:
        """End the thread after its current operation (it is a daemon: an upload still in
        flight when the process exits is cut short, and without its commit it never counts)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                if failures:  # the backoff runs out whatever is asked meanwhile
                    self._cond.wait_for(
                        lambda: self._stopping, timeout=self.policy.delay(failures - 1)
                    )
                elif not self._cond.wait_for(
                    lambda: self._stopping or self._requested > self._completed,
                    timeout=self.poll_s,
                ):
                    self._requested += 1  # polling a script's checkpoint directory
                if self._stopping:
                    return
                target, run_files = self._requested, self._run_files
            try:
                self._pass(run_files)
            except BucketError as exc:
                retry = bucket_retryable(exc)
                expired = isinstance(exc, CredentialsLapsed)
                failures += 1
                with self._cond:
                    self._error = str(exc)
                    self._gave_up = not retry
                    self._cond.notify_all()
                if not retry:
                    log.error(
                        "checkpoint_sync_stopped",
                        error=str(exc),
                        message="uploads to the bucket stopped for this run (training goes "
                        "on): fix the credentials or the bucket, then resume the run",
                    )
                    return
                log.warning(
                    "checkpoint_sync_failed",
                    error=str(exc),
                    cause="credentials_expired" if expired else "unreachable",
                    retry_in_s=self.policy.delay(failures - 1),
                    message=(
                        "the bucket credentials expired; training goes on and uploads "
                        "catch up once they are renewed"
                        if expired
                        else "bucket unreachable; training goes on and uploads catch up"
                    ),
                )
                continue
            if failures:
                log.info("checkpoint_sync_recovered", after_failures=failures)
            failures = 0
            with self._cond:
                self._completed = max(self._completed, target)
                self._error = None
                self._cond.notify_all()

    def _pending(self) -> list[str]:
        """Committed local checkpoints the bucket does not hold (as far as this process knows)."""
        if self.script_dir is not None:
            newest = _newest_file(self.script_dir)
            if newest is None:
                return []
            return [] if self._known.get(newest.name) == self._digest(newest) else [newest.name]
        local = [p for _, p in local_checkpoints(self.run_dir / "checkpoints")]
        return [p.name for p in local if self._known.get(p.name) != _commit_or_none(p)]

    def _digest(self, path: Path) -> bytes:
        """SHA-256 of a script's checkpoint file, computed again only when it changed."""
        stat = path.stat()
        seen = self._digests.get(path.name)
        if seen is None or seen[:2] != (stat.st_size, stat.st_mtime_ns):
            seen = (stat.st_size, stat.st_mtime_ns, _sha256(path))
            self._digests[path.name] = seen
        return seen[2].encode()

    def _pass(self, run_files: bool) -> None:
        if self.script_dir is not None:
            self._pass_script(self.script_dir)
        else:
            self._pass_checkpoints()
        self._send_tree(self.run_dir / "logs", "logs")
        if run_files:
            for name in RUN_FILES:
                if (self.run_dir / name).is_file():
                    self.bucket.upload_file(self.run_dir / name, f"{self.run_id}/{name}")
            self._send_tree(self.run_dir / "wandb", "wandb")
            self._send_outputs()

    def _send_outputs(self) -> None:
        """A script's outputs outside the run directory, under ``outputs/`` (the paths its
        ``script-outputs.json`` lists, relative to its workdir), as ``fab fetch`` lays them
        out at home."""
        try:
            record = json.loads((self.run_dir / OUTPUTS_FILE).read_text())
        except (OSError, ValueError):
            return
        workdir = Path(record["workdir"])
        for listed in record.get("paths", []):
            path = workdir / listed
            under = f"outputs/{listed.lstrip('/')}"
            if path.is_dir():
                self._send_tree(path, under)
            elif path.is_file():
                self.bucket.upload_file(path, f"{self.run_id}/{under}")

    def _pass_script(self, directory: Path) -> None:
        """The newest committed checkpoint of a script: only it is needed to resume."""
        try:
            path = _newest_file(directory)
            if path is None:
                return
            digest = self._digest(path)
        except FileNotFoundError:
            return  # replaced by a newer one meanwhile: the next pass takes that
        if self._known.get(path.name) == digest:
            return
        started = time.monotonic()
        sent = upload_script_checkpoint(self.bucket, self.run_id, path, digest.decode())
        with self._cond:
            self._known = {path.name: digest}
            if sent:
                self._uploaded.append(path.name)
        if sent:
            log.info(
                "checkpoint_synced",
                checkpoint=path.name,
                step=None,
                seconds=round(time.monotonic() - started, 3),
                url=self.bucket.url_of(f"{self.run_id}/checkpoints/{path.name}"),
            )

    def _pass_checkpoints(self) -> None:
        directory = self.run_dir / "checkpoints"
        for step, path in reversed(local_checkpoints(directory)):
            commit = _commit_or_none(path)
            if commit is None or self._known.get(path.name) == commit:
                continue
            started = time.monotonic()
            try:
                sent = upload_checkpoint(self.bucket, self.run_id, path)
            except BucketError:
                if _commit_or_none(path) is None:  # pruned on disk meanwhile: nothing to send
                    continue
                raise
            with self._cond:
                self._known[path.name] = commit
                if sent:
                    self._uploaded.append(path.name)
            if sent:
                log.info(
                    "checkpoint_synced",
                    checkpoint=path.name,
                    step=step,
                    seconds=round(time.monotonic() - started, 3),
                    lag_s=round(time.time() - _commit_mtime(path), 3),
                    url=self.bucket.url_of(f"{self.run_id}/checkpoints/{path.name}"),
                )
        removed = prune(self.bucket, self.run_id, self.keep_last)
        with self._cond:
            for name in removed:
                self._known.pop(name, None)
        if removed:
            log.info("checkpoint_sync_pruned", removed=removed, keep_last=self.keep_last)

    def _send_tree(self, root: Path, under: str) -> None:
        """Upload the files under ``root`` that changed since this process last sent them."""
        if not root.is_dir():
            return
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            rel = path.relative_to(root).as_posix()
            seen = (stat.st_size, stat.st_mtime_ns)
            if self._sent_logs.get(f"{under}/{rel}") == seen:
                continue
            try:
                self.bucket.upload_file(path, f"{self.run_id}/{under}/{rel}")
            except BucketError:
                if path.exists():
                    raise
                continue  # a temporary file that went away
            self._sent_logs[f"{under}/{rel}"] = seen


def final_pass(
    bucket: Bucket,
    run_id: str,
    run_dir: Path,
    keep_last: int,
    timeout: float,
    script_dir: Path | None = None,
) -> None:
    """``ups launch`` after the run's outcome is final: the checkpoints the bucket lacks,
    the logs, ``outcome.json`` and W&B, within ``timeout``; the log says how it went."""
    uploader = Uploader(bucket, run_id, run_dir, keep_last, script_dir=script_dir)
    uploader.include_run_files()
    uploader.start(announce=False)
    report = uploader.flush(timeout)
    uploader.stop()
    if report.complete:
        log.info("run_synced", url=report.url, checkpoints_uploaded_now=report.uploaded)
    else:
        log.warning(
            "run_not_synced",
            url=report.url,
            pending=report.pending,
            error=report.error,
            message="the run directory on this host has what the bucket lacks",
        )


def _commit_or_none(path: Path) -> bytes | None:
    try:
        return commit_bytes(path)
    except FileNotFoundError:
        return None


def _commit_mtime(path: Path) -> float:
    commit = (
        path.with_name(path.name + ".sha256") if path.suffix == ".pt" else path / "manifest.json"
    )
    try:
        return commit.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def _newest_file(directory: Path) -> Path | None:
    """A script's newest committed checkpoint when it is a file (a directory, e.g. a
    sharded checkpoint, is not synced: docs/script.md)."""
    newest = ckpt.latest(directory) if directory.is_dir() else None
    return newest if newest is not None and newest.is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def restore_logs(bucket: Bucket, run_id: str, run_dir: Path) -> list[str]:
    """A run continued on a new host (an empty run directory) takes the per-rank logs the
    bucket holds of it before any rank writes, so each rank's log continues where the
    last host's ended and the next upload keeps them whole; returns the names taken.
    (``launch.log`` is not among them: a managed run's supervisor puts its own whole copy
    on the new instance.)

    A log the run directory already has is its own and is left alone; a bucket that does
    not answer leaves the logs to start afresh, saying so."""
    taken = []
    try:
        for key in bucket.list(f"{run_id}/logs/"):
            rel = key.removeprefix(f"{run_id}/logs/")
            local = run_dir / "logs" / rel
            if not (rel.startswith("rank") and rel.endswith(".jsonl")) or local.exists():
                continue
            bucket.download_file(key, local)
            taken.append(rel)
    except BucketError as exc:
        log.warning(
            "logs_restore_failed",
            error=str(exc),
            text="the ranks' logs here start empty; the bucket keeps the earlier ones until "
            "this run's first upload replaces them",
        )
        return taken
    if taken:
        log.info(
            "logs_restored",
            names=taken,
            text=f"continued {len(taken)} rank log(s) from {bucket.url_of(run_id + '/logs/')}",
        )
    return taken
