"""Checkpoints that are never half-written.

Rank 0 serialises to memory, writes a temporary file, fsyncs it, renames it into
place and records its SHA-256 beside it. Resume walks checkpoints newest first and
takes the first that verifies and loads (``weights_only=True``); a corrupt one is
reported and skipped, never trusted.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from ups.fsio import atomic_write_bytes, atomic_write_text
from ups.log import get_logger

_NAME = re.compile(r"^step_(\d+)\.pt$")
log = get_logger("checkpoint")


class CheckpointCorrupt(RuntimeError):
    """A checkpoint file failed its checksum or could not be loaded."""


class CheckpointSaveFailed(RuntimeError):
    """Rank 0 could not write a checkpoint (disk full, I/O error, permissions)."""

    def __init__(self, path: Path, needed: int, cause: OSError) -> None:
        self.path, self.needed, self.cause = path, needed, cause
        self.free = _free_bytes(path.parent)
        super().__init__(self.reason())

    def reason(self) -> str:
        code = errno.errorcode.get(self.cause.errno or 0, "error")
        free = "unknown" if self.free is None else f"{self.free} bytes"
        fix = {
            errno.ENOSPC: "free space on that disk (old runs: du -sh runs/*), lower "
            "checkpoint.keep_last, or point run.output_dir at a bigger disk",
            errno.EDQUOT: "raise the disk quota or free space",
            errno.EACCES: "make the checkpoint directory writable by this user",
            errno.EROFS: "point run.output_dir at a writable disk",
        }.get(self.cause.errno or 0, "check that disk (dmesg, smartctl) or move run.output_dir")
        return (
            f"checkpoint save failed: {code} ({os.strerror(self.cause.errno or 0)}) writing "
            f"{self.path}: it needs {self.needed} bytes, {free} free there; the earlier "
            f"checkpoints are intact. Fix: {fix}, then run the same command again to resume"
        )


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:06d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Finished checkpoint files, oldest first (temporary files are ignored)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write ``state`` atomically as ``step_<step>.pt`` and keep only the newest ``keep_last``.

    Raises :class:`CheckpointSaveFailed` on any OS error; no temporary or half-recorded
    file is left behind (a checkpoint without its digest is removed too), and older
    checkpoints are only pruned after the new one is complete.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getbuffer()
    path = checkpoint_path(directory, step)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        try:
            atomic_write_text(_digest_path(path), hashlib.sha256(data).hexdigest() + "\n")
        except OSError:
            path.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise CheckpointSaveFailed(path, len(data), exc) from exc
    for _, old in list_checkpoints(directory)[:-keep_last]:
        old.unlink(missing_ok=True)
        _digest_path(old).unlink(missing_ok=True)
    return path


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Verify and load one checkpoint. Raises :class:`CheckpointCorrupt`."""
    data = path.read_bytes()
    digest_file = _digest_path(path)
    if digest_file.exists():
        expected = digest_file.read_text().strip()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise CheckpointCorrupt(
                f"{path}: SHA-256 {actual[:12]}… does not match the recorded {expected[:12]}… "
                f"({len(data)} bytes on disk; truncated or modified)"
            )
    try:
        state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise CheckpointCorrupt(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    return state


def latest_good_checkpoint(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies and loads; corrupt ones are logged and skipped."""
    for _, path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path)
        except CheckpointCorrupt as exc:
            log.warning("checkpoint_corrupt", path=str(path), error=str(exc), action="skipped")
    return None
