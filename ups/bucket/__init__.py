"""Runs in an S3-compatible bucket (``checkpoint_sync``): the store, the checkpoint layout
and the uploader that rank 0 of a training run feeds. Imports neither torch nor boto3 at
import time (deploy and the supervisor use it on a laptop)."""

from ups.bucket.checkpoints import (
    CheckpointMismatch,
    CheckpointRef,
    committed_checkpoints,
    fetch_checkpoint,
    newest_checkpoint,
)
from ups.bucket.store import (
    Bucket,
    BucketError,
    BucketUnreachable,
    PreconditionFailed,
    Stored,
    parse_url,
)

__all__ = [
    "Bucket",
    "BucketError",
    "BucketUnreachable",
    "CheckpointMismatch",
    "CheckpointRef",
    "PreconditionFailed",
    "Stored",
    "committed_checkpoints",
    "fetch_checkpoint",
    "newest_checkpoint",
    "parse_url",
]
