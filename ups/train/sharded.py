"""Sharded checkpoints (``training.strategy: fsdp``): one directory per step, complete or absent.

Every rank writes its shard with ``torch.distributed.checkpoint`` into a temporary
directory, ``.step_<N>.dcp.tmp``. DCP's last phase gathers every rank's write result on
rank 0 (an error on any rank is raised on every rank), so when ``dcp.save`` returns the
shards are all on disk and fsynced. Only then does rank 0 add ``meta.pt`` (schedule,
counters, RNG, run facts: the same non-tensor entries a ``.pt`` checkpoint holds) and
``manifest.json`` (the SHA-256 of every file), and rename the directory to
``step_<N>.dcp``: the rename is the commit point. A directory without its manifest, or
whose files do not match it, is reported and skipped by resume, never trusted.

All ranks must see one directory: on several hosts ``run.output_dir`` has to be shared.

``torch.distributed.checkpoint`` (about 1 s of CPU to import) is imported by the functions
that read or write shards: a DDP run, which only asks :func:`other_format_checkpoint`,
never loads it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ups import jsonio
from ups.fsio import atomic_write_bytes, atomic_write_text, fsync_dir
from ups.log import get_logger
from ups.train.checkpoint import CheckpointCorrupt, CheckpointSaveFailed, list_checkpoints

_NAME = re.compile(r"^step_(\d+)\.dcp$")
_LEFTOVER = re.compile(r"^\.step_\d+\.dcp\.(tmp|old)$")
"""A killed attempt's temporary directory, or a replaced one not yet removed."""
META = "meta.pt"
MANIFEST = "manifest.json"
log = get_logger("checkpoint")


def sharded_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:06d}.dcp"


def list_sharded(directory: Path) -> list[tuple[int, Path]]:
    """Committed sharded checkpoints, oldest first (temporary directories are ignored)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def _os_error(exc: BaseException) -> OSError:
    """The first OSError behind a DCP failure (any rank's), else an EIO carrying its text."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, CheckpointException):
        for failure in exc.failures.values():
            found = failure if isinstance(failure, OSError) else None
            found = found or getattr(failure, "exc", None)
            if isinstance(found, OSError):
                return found
    return OSError(errno.EIO, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _nbytes(state: Any) -> int:
    if isinstance(state, Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return int(local.numel() * local.element_size())
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_nbytes(v) for v in state)
    return 0


def _commit(tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    """Rank 0: meta, manifest, rename. A same-step directory (a resumed run saving the step
    it resumed at) is replaced: moved aside first, removed after the rename."""
    buffer = io.BytesIO()
    torch.save(meta, buffer)
    atomic_write_bytes(tmp / META, buffer.getbuffer())
    digests = {
        str(f.relative_to(tmp)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(tmp.rglob("*"))
        if f.is_file()
    }
    atomic_write_text(tmp / MANIFEST, jsonio.dumps({"files": digests}) + "\n")
    fsync_dir(tmp)
    aside = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    try:
        tmp.rename(final)
    except OSError:
        if aside.exists():
            aside.rename(final)
        raise
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def save_sharded(
    directory: Path,
    step: int,
    shards: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int,
    *,
    is_rank0: bool,
) -> Path:
    """Every rank: write this rank's part of ``shards``; rank 0 commits ``meta`` and prunes
    to the newest ``keep_last``. Raises :class:`CheckpointSaveFailed` (on every rank when a
    shard write failed anywhere; on rank 0 alone when its commit failed)."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    final = sharded_path(directory, step)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        if is_rank0:
            directory.mkdir(parents=True, exist_ok=True)
            # Safe while the others wait: no rank writes a file before DCP's planning
            # collective, which needs rank 0. A stale one is a killed attempt's.
            shutil.rmtree(tmp, ignore_errors=True)
        dcp_save(shards, checkpoint_id=tmp)
        if is_rank0:
            _commit(tmp, final, meta)
    except (OSError, CheckpointException) as exc:
        if is_rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointSaveFailed(final, _nbytes(shards), _os_error(exc)) from exc
    if is_rank0:
        for _, old in list_sharded(directory)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in directory.iterdir():
            if _LEFTOVER.match(stale.name):
                shutil.rmtree(stale, ignore_errors=True)
    return final


def verify_sharded(path: Path) -> dict[str, Any]:
    """Check every file against the manifest and load ``meta.pt``. Raises CheckpointCorrupt."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(f"{path}: no readable {MANIFEST} ({exc})") from exc
    for name, expected in sorted(manifest.items()):
        try:
            actual = hashlib.sha256((path / name).read_bytes()).hexdigest()
        except OSError as exc:
            raise CheckpointCorrupt(f"{path}: {name} is missing ({exc})") from exc
        if actual != expected:
            raise CheckpointCorrupt(
                f"{path}: {name} SHA-256 {actual[:12]}… does not match the recorded "
                f"{expected[:12]}… (truncated or modified)"
            )
    try:
        meta: dict[str, Any] = torch.load(path / META, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise CheckpointCorrupt(f"{path}: {META} cannot be loaded ({exc})") from exc
    return meta


def latest_good_sharded(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest sharded checkpoint that verifies; corrupt ones are logged and skipped."""
    for _, path in reversed(list_sharded(directory)):
        try:
            return path, verify_sharded(path)
        except CheckpointCorrupt as exc:
            log.warning("checkpoint_corrupt", path=str(path), error=str(exc), action="skipped")
    return None


def load_shards(path: Path, shards: dict[str, Any]) -> None:
    """Every rank: fill ``shards`` (a state dict of the right sharded shapes) in place."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    dcp_load(shards, checkpoint_id=path)


def consolidated_model(path: Path) -> dict[str, Tensor]:
    """The full model weights of a sharded checkpoint, read in this one process."""
    # DCP's public converter (format_utils.dcp_to_torch_save) writes the optimizer too;
    # the same loader with a key filter reads only the model.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(path),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),  # type: ignore[no-untyped-call]
        no_dist=True,
    )
    model: dict[str, Tensor] = state["model"]
    return model


def other_format_checkpoint(directory: Path, strategy: str) -> Path | None:
    """The newest checkpoint written under the other ``training.strategy``, if any."""
    found = list_checkpoints(directory) if strategy == "fsdp" else list_sharded(directory)
    return found[-1][1] if found else None
