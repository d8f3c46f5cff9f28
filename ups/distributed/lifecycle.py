"""One place that starts and one place that ends the process group."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ups.config import DistributedConfig
from ups.distributed.env import DistEnv


def init_distributed(env: DistEnv, cfg: DistributedConfig) -> torch.device:
    """Init the process group (bounded by ``cfg.init_timeout_s``), pick the device, barrier.

    A plain process (no torchrun) gets a one-rank gloo group on an in-memory store, so
    the training loop runs the same collectives either way.
    """
    use_cuda = torch.cuda.is_available() and cfg.backend != "gloo"
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "distributed.backend is 'nccl' but CUDA is not available on this host; "
            "set distributed.backend=auto (gloo on CPU)"
        )
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        dump_prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        if dump_prefix:  # the flight recorder writes <prefix><rank> but creates no directory
            Path(dump_prefix).parent.mkdir(parents=True, exist_ok=True)
    timeout = dt.timedelta(seconds=cfg.init_timeout_s)
    if env.under_torchrun:
        dist.init_process_group(
            backend=backend,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
    else:
        store = dist.HashStore()  # type: ignore[attr-defined]  # not re-exported in the stubs
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
    dist.barrier()
    return device


def set_collective_timeout(seconds: float) -> None:
    """Tighten the timeout of every later collective (after the slow first step)."""
    dist.distributed_c10d._set_pg_timeout(dt.timedelta(seconds=seconds))


def shutdown_distributed() -> None:
    """Tear the process group down; safe to call when none was started."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
