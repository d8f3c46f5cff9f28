"""The run's bucket as its supervisor uses it (when the run config sets
``checkpoint_sync.url``): ``<run_id>/run.json`` (the run's record) written beside the
checkpoints the instance uploads, and the newest committed checkpoint fetched home before a
recovery when it is newer than the newest one synced over SSH. The lease held there too is
:mod:`ups.deploy.managed.lease`'s.

A bucket that cannot be reached never stops supervision: the local state and lease stay
authoritative on this machine, and each failed write is said once and made again on the next
change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ups.bucket import (
    Bucket,
    BucketError,
    PreconditionFailed,
    fetch_checkpoint,
    newest_checkpoint,
)
from ups.bucket.checkpoints import local_checkpoints
from ups.config import Config
from ups.deploy.managed import record as supervision
from ups.deploy.managed.record import State
from ups.workload import ScriptWorkload


def open_for(cfg: Config | None, workload: ScriptWorkload | None = None) -> Bucket | None:
    """The run's bucket: the config's ``checkpoint_sync``, or a script's run file's."""
    if workload is not None:
        url, endpoint = workload.checkpoint_sync, workload.sync_endpoint
    else:
        assert cfg is not None  # a trainer run has its config
        url, endpoint = cfg.checkpoint_sync.url, cfg.checkpoint_sync.endpoint_url
    return Bucket.open(url, endpoint_url=endpoint) if url else None


def mirror(bucket: Bucket, run_id: str, say: Callable[[str], None]) -> Callable[[str, bytes], None]:
    """A :data:`~ups.deploy.managed.record.Mirror` writing ``<run_id>/<name>``.

    Where the store honours conditional writes (the lease asked it), each write after this
    supervisor's first is made only if the object is still the one it wrote last
    (``If-Match``): a supervisor stopped in the middle of a write, whose lease another took
    meanwhile, cannot overwrite the new holder's record when it wakes."""
    written: dict[str, tuple[str, bytes]] = {}
    """What this process wrote last to each name: its ETag and its bytes."""

    def put(name: str, data: bytes) -> None:
        key = f"{run_id}/{name}"
        try:
            if bucket.conditions and name in written:
                etag, last = written[name]
                try:
                    written[name] = bucket.put_if_match(key, data, etag), data
                except PreconditionFailed:
                    stored = bucket.get_stored(key)
                    if stored is None or stored.data != last:
                        raise
                    # our last write landed though its answer was lost: it is still ours
                    written[name] = bucket.put_if_match(key, data, stored.etag), data
            else:
                written[name] = bucket.put_bytes(key, data), data
        except PreconditionFailed:
            say(
                f"warning: {name} not written to the bucket: another supervisor wrote it "
                "since this one did (it holds the run now)"
            )
        except BucketError as err:
            say(f"warning: {name} not written to the bucket this time ({err}); kept locally")

    return put


def saved_state(bucket: Bucket, run_id: str, say: Callable[[str], None]) -> State | None:
    """The run's record as its last supervisor mirrored it (another machine's, when this
    one has none; the previous release's ``supervision.json`` too), or None."""
    for name in (supervision.FILE, supervision.LEGACY_FILE):
        key = f"{run_id}/{name}"
        try:
            raw = bucket.get_bytes(key)
        except BucketError as err:
            say(f"warning: the run's record could not be read from the bucket ({err})")
            return None
        if raw is not None:
            return supervision.parse(raw.decode(), bucket.url_of(key))
    return None


def fetch_newer(
    bucket: Bucket, run_id: str, local_dir: Path, say: Callable[[str], None]
) -> int | None:
    """Bring the bucket's newest committed checkpoint home when it is newer than ours;
    return its step (None: the bucket has none, or could not be read)."""
    try:
        ref = newest_checkpoint(bucket, run_id)
        have = local_checkpoints(local_dir)
        if ref is None or (have and have[-1][0] >= ref.step):
            return None if ref is None else ref.step
        path = fetch_checkpoint(bucket, ref, local_dir)
    except BucketError as err:
        say(f"warning: the bucket's checkpoints could not be read ({err}); using the local ones")
        return None
    say(f"fetched checkpoint step {ref.step} from {bucket.url_of(ref.key)} to {path}")
    return ref.step


def newest_step(bucket: Bucket, run_id: str) -> int | None:
    """The step of the bucket's newest committed checkpoint (None: none, or unreadable)."""
    try:
        ref = newest_checkpoint(bucket, run_id)
    except BucketError:
        return None
    return None if ref is None else ref.step
