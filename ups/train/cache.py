"""The latent cache: encoder outputs computed once, stored as CPU tensors, reused by training.

``ups cache build CONFIG`` encodes every training input with the encoders of a checkpoint
(default: the newest good one of the latest run) and writes, under ``cache.dir``:

- ``<task>.pt``: ``{"z": Tensor[n_items, tokens, latent_dim]}`` in dataset index order;
- ``encoders.pt``: the encoder weights the latents came from;
- ``manifest.json``: tasks, shapes and where the encoders came from.

Everything is moved to the CPU before saving, so a cache can never carry CUDA storages
(the CPU-only cache failure), and files are read with ``weights_only=True, mmap=True``:
every rank on a node maps the same page-cache copy, read-only. The rank gathers each
step's rows itself (one copy of the batch's rows); its DataLoader workers, forked after
the load, inherit the mapping and never touch it, so no worker holds a copy.
With ``cache.enabled`` the trainer loads ``encoders.pt``, freezes the encoders and trains
the operator and decoders on the cached latents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import Tensor

from ups import jsonio
from ups.config import Config
from ups.data.pdebench import PDEBenchDataset, TaskInfo
from ups.fsio import atomic_write_text
from ups.model import LatentOperator
from ups.train.startcheck import CACHE_MANIFEST

log = structlog.get_logger()
ENCODERS = "encoders.pt"


class CacheError(ValueError):
    """The latent cache is missing, stale or does not match the config."""


@torch.no_grad()
def build_cache(
    cfg: Config, infos: dict[str, TaskInfo], model: LatentOperator, source: str
) -> list[Path]:
    """Encode every task's training inputs with ``model``'s encoders and write the cache."""
    out = cfg.cache.dir
    out.mkdir(parents=True, exist_ok=True)
    model = model.cpu().eval()
    written = []
    for task in cfg.tasks:
        dataset = PDEBenchDataset(task, "train", infos[task.name])
        chunks = []
        for start in range(0, len(dataset), 256):
            xs = torch.stack([dataset[i][0] for i in range(start, min(start + 256, len(dataset)))])
            chunks.append(model.encode(task.name, xs).cpu())
        path = out / f"{task.name}.pt"
        torch.save({"z": torch.cat(chunks).contiguous()}, path)
        written.append(path)
        log.info("cache_written", task=task.name, path=str(path), items=len(dataset))
    encoders = {k: v.cpu() for k, v in model.encoders.state_dict().items()}
    torch.save(encoders, out / ENCODERS)
    manifest = {
        "source": source,
        "tasks": {
            t.name: {"items": len(PDEBenchDataset(t, "train", infos[t.name])), "path": str(t.path)}
            for t in cfg.tasks
        },
        "latent_dim": cfg.model.latent_dim,
    }
    atomic_write_text(out / CACHE_MANIFEST, jsonio.dumps(manifest, indent=2) + "\n")
    return [*written, out / ENCODERS, out / CACHE_MANIFEST]


def load_cache(cfg: Config, infos: dict[str, TaskInfo], model: LatentOperator) -> dict[str, Tensor]:
    """Load the cached latents (memory-mapped) and the matching frozen encoders into ``model``."""
    directory = cfg.cache.dir
    try:
        manifest: dict[str, Any] = json.loads((directory / CACHE_MANIFEST).read_text())
        encoders = torch.load(directory / ENCODERS, weights_only=True, map_location="cpu")
        latents = {
            t.name: torch.load(directory / f"{t.name}.pt", weights_only=True, mmap=True)["z"]
            for t in cfg.tasks
        }
    except (OSError, KeyError, RuntimeError, ValueError) as exc:
        raise CacheError(
            f"latent cache {directory} is incomplete or unreadable ({exc}); rebuild it with "
            "`ups cache build CONFIG` or set cache.enabled=false"
        ) from None
    problems = []
    for t in cfg.tasks:
        items = len(PDEBenchDataset(t, "train", infos[t.name]))
        cached = latents[t.name]
        if manifest.get("tasks", {}).get(t.name, {}).get("items") != items or len(cached) != items:
            problems.append(f"task {t.name!r}: cache has {len(cached)} items, the data {items}")
        if cached.shape[-1] != cfg.model.latent_dim:
            problems.append(f"task {t.name!r}: latent width {cached.shape[-1]} != model.latent_dim")
    if problems:
        raise CacheError(
            f"latent cache {directory} does not match the config: {'; '.join(problems)}; "
            "rebuild it with `ups cache build CONFIG`"
        )
    model.encoders.load_state_dict(encoders)
    model.encoders.requires_grad_(False)
    return latents
