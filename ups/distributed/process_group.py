"""One place that starts and one place that ends the process group."""

from __future__ import annotations

import atexit
import datetime as dt
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ups.config import DistributedConfig
from ups.distributed.env import DistEnv


def uses_cuda(cfg: DistributedConfig) -> bool:
    """True when a run with ``cfg`` trains on CUDA: a GPU is visible and the backend is not
    ``gloo`` (which keeps the run on the CPU)."""
    return cfg.on_cuda(torch.cuda.is_available())


def init_distributed(env: DistEnv, cfg: DistributedConfig) -> torch.device:
    """Init the process group (bounded by ``cfg.init_timeout_s``), pick the device, barrier.

    A plain process (no torchrun) gets a one-rank gloo group on an in-memory store, so
    the training loop runs the same collectives either way.
    """
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if uses_cuda(cfg) else "gloo")
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
    atexit.unregister(_drain_gloo)  # once, however often a process inits
    atexit.register(_drain_gloo)
    return device


def set_collective_timeout(seconds: float) -> None:
    """Tighten the timeout of every later collective (after the slow first step)."""
    dist.distributed_c10d._set_pg_timeout(dt.timedelta(seconds=seconds))


GLOO_DRAIN_S = 0.2
"""How long the main thread lets gloo's worker threads take the GIL before the teardown."""


def shutdown_distributed() -> None:
    """Tear the process group down; safe to call when none was started.

    Under gloo, a worker thread drops a finished collective's tensors after the caller was
    woken; a tensor whose Python object is already gone needs the GIL for that. The process
    group's destructor joins those threads while the main thread holds the GIL, so a thread
    still dropping one deadlocks the rank at exit (seen under load: every rank finished,
    one never exited). The barrier makes every earlier collective complete on both sides;
    the sleep releases the GIL so the threads finish their bookkeeping before the join.
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo":
            dist.barrier()
            _drain_gloo()
        dist.destroy_process_group()


def _drain_gloo() -> None:
    """Release the GIL a moment while gloo's threads may still hold finished work.

    Also run at exit (registered by :func:`init_distributed`): a rank that leaves without
    :func:`shutdown_distributed` (preempted, failed) has its process group destroyed while
    the interpreter finalizes, with the same join under the GIL.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        time.sleep(GLOO_DRAIN_S)
