"""The run's bucket as its supervisor uses it (when the run config sets
``checkpoint_sync.url``): ``<run_id>/supervision.json`` and ``<run_id>/supervisor.lease``
written beside the checkpoints the instance uploads, and the newest committed checkpoint
fetched home before a recovery when it is newer than the newest one synced over SSH.

A bucket that cannot be reached never stops supervision: the local state and lease
stay authoritative on this machine, and each failed write is said once and made again on
the next change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ups import jsonio
from ups.bucket import Bucket, BucketError, fetch_checkpoint, newest_checkpoint
from ups.bucket.checkpoints import local_checkpoints
from ups.config import Config
from ups.deploy.managed import record as supervision
from ups.deploy.managed.lease import LEASE_FILE, Holder, LeaseHeld
from ups.deploy.managed.record import State

SETTLE_S = 2.0
"""Between writing the lease object and reading it back: S3 has no compare-and-swap that
every S3-compatible store honours, so the last writer wins and a loser learns it here.
Longer than one read-then-write round trip of a rival, so two cannot both keep it."""


def open_for(cfg: Config) -> Bucket | None:
    sync = cfg.checkpoint_sync
    return Bucket.open(sync.url, endpoint_url=sync.endpoint_url) if sync.url else None


def mirror(bucket: Bucket, run_id: str, say: Callable[[str], None]) -> Callable[[str, bytes], None]:
    """A :data:`~ups.deploy.managed.record.Mirror` writing ``<run_id>/<name>``."""

    def put(name: str, data: bytes) -> None:
        try:
            bucket.put_bytes(f"{run_id}/{name}", data)
        except BucketError as err:
            say(f"warning: {name} not written to the bucket this time ({err}); kept locally")

    return put


def saved_state(bucket: Bucket, run_id: str, say: Callable[[str], None]) -> State | None:
    """The run's supervision state as its last supervisor mirrored it (another machine's,
    when this one has none), or None."""
    key = f"{run_id}/{supervision.FILE}"
    try:
        raw = bucket.get_bytes(key)
    except BucketError as err:
        say(f"warning: the run's supervision state could not be read from the bucket ({err})")
        return None
    return None if raw is None else supervision.parse(raw.decode(), bucket.url_of(key))


def fetch_newer(bucket: Bucket, run_id: str, local_dir: Path, say: Callable[[str], None]) -> None:
    """Bring the bucket's newest committed checkpoint home when it is newer than ours."""
    try:
        ref = newest_checkpoint(bucket, run_id)
        have = local_checkpoints(local_dir)
        if ref is None or (have and have[-1][0] >= ref.step):
            return
        path = fetch_checkpoint(bucket, ref, local_dir)
    except BucketError as err:
        say(f"warning: the bucket's checkpoints could not be read ({err}); using the local ones")
        return
    say(f"fetched checkpoint step {ref.step} from {bucket.url_of(ref.key)} to {path}")


def take_lease(
    bucket: Bucket, run_id: str, mine: Holder, refuse: Callable[[Holder], LeaseHeld]
) -> None:
    """Hold ``<run_id>/supervisor.lease`` in the bucket too (supervisors on other
    machines), or raise ``refuse(holder)`` when a live one holds it."""
    key = f"{run_id}/{LEASE_FILE}"
    try:
        held = read_lease(bucket, run_id)
        if held is None or held.token == mine.token or not held.alive():
            bucket.put_bytes(key, jsonio.dumps(asdict(mine)).encode())
            time.sleep(SETTLE_S)  # a rival's write in flight lands before the read-back
            held = read_lease(bucket, run_id)
    except BucketError:
        return  # an outage: the local lease holds here; renewals write it once it is back
    if held is not None and held.token != mine.token:
        raise refuse(held)


def renew_lease(bucket: Bucket, run_id: str, mine: Holder) -> None:
    try:
        held = read_lease(bucket, run_id)
        if held is None or held.token == mine.token:
            bucket.put_bytes(f"{run_id}/{LEASE_FILE}", jsonio.dumps(asdict(mine)).encode())
    except BucketError:
        pass  # an outage: the next renewal writes it again; the local lease still holds


def release_lease(bucket: Bucket, run_id: str, token: str) -> None:
    try:
        held = read_lease(bucket, run_id)
        if held is not None and held.token == token:
            bucket.delete(f"{run_id}/{LEASE_FILE}")
    except BucketError:
        pass  # it expires by itself within the lease's TTL


def read_lease(bucket: Bucket, run_id: str) -> Holder | None:
    data = bucket.get_bytes(f"{run_id}/{LEASE_FILE}")
    if data is None:
        return None
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):
        return None  # a damaged lease protects nothing
