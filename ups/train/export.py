"""One consolidated, ``weights_only``-loadable weights file from a run's newest good checkpoint.

Both checkpoint formats are read: a ``.pt`` file (``training.strategy: ddp``) or a sharded
directory (``fsdp``), whose shards are gathered in this one process, no process group.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from ups.fsio import atomic_write_bytes
from ups.train.checkpoint import latest_good_checkpoint
from ups.train.sharded import consolidated_model, latest_good_sharded


class NothingToExport(ValueError):
    """The run directory holds no checkpoint that verifies."""


def newest_weights(checkpoints: Path) -> tuple[Path, int, str, dict[str, torch.Tensor]]:
    """``(checkpoint, step, strategy, model weights)`` of the newest good checkpoint."""
    found: list[tuple[int, Path, str, dict[str, Any]]] = []
    if (hit := latest_good_checkpoint(checkpoints)) is not None:
        found.append((int(hit[1]["train_state"]["step"]), hit[0], "ddp", hit[1]))
    if (sharded := latest_good_sharded(checkpoints)) is not None:
        found.append((int(sharded[1]["train_state"]["step"]), sharded[0], "fsdp", sharded[1]))
    if not found:
        raise NothingToExport(
            f"no checkpoint that verifies in {checkpoints}: nothing to export (a run writes "
            f"one every checkpoint.every_steps steps and at its end; see the run's logs)"
        )
    step, path, strategy, state = max(found, key=lambda f: f[0])
    weights = state["model"] if strategy == "ddp" else consolidated_model(path)
    return path, step, strategy, {k: v.detach().cpu().contiguous() for k, v in weights.items()}


def export_weights(run_dir: Path, out: Path | None = None) -> tuple[Path, Path, int]:
    """Write ``{"model": weights, "step", "strategy", "checkpoint"}`` atomically; return
    ``(written file, checkpoint read, step)``. Default path: ``RUN/export/model_step_N.pt``."""
    source, step, strategy, weights = newest_weights(run_dir / "checkpoints")
    target = out or run_dir / "export" / f"model_step_{step:06d}.pt"
    buffer = io.BytesIO()
    payload = {"model": weights, "step": step, "strategy": strategy, "checkpoint": str(source)}
    torch.save(payload, buffer)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, buffer.getbuffer())
    return target, source, step
