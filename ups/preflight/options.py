"""What a preflight run is asked to check, and the context every check reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ups.config import Config
from ups.config.schema import BurnInMode

DEFAULT_MASTER_PORT = 29500


@dataclass(kw_only=True, slots=True)
class PreflightOptions:
    """Inputs of :func:`ups.preflight.run_preflight`. Everything is optional."""

    config: Path | str | Config | None = None
    """Run config (path or loaded). Without one, data/cache checks are skipped."""
    overrides: list[str] = field(default_factory=list)
    """``--set key.path=value`` overrides applied when ``config`` is a path."""
    expected_gpus: int | None = None
    """GPUs this host must show. Default: ``nproc_per_node`` when the backend is nccl."""
    nproc_per_node: int | None = None
    """Workers per node (flag); default ``distributed.nproc_per_node`` from the config."""
    master_port: int | None = None
    """Default: ``distributed.master_port`` from the config, else 29500."""
    rdzv_port: int | None = None
    """Rendezvous port to check as well (torchrun ``--rdzv-endpoint``); None: not checked."""
    only: list[str] = field(default_factory=list)
    """Run only these checks (names or groups, see ``ups.preflight.checks.GROUPS``)."""
    skip: list[str] = field(default_factory=list)
    shm_path: Path = Path("/dev/shm")
    pins_path: Path | None = None
    """pins.toml; default: ``$UPS_PINS``, ``./pins.toml``, then the one beside the package."""
    strict: bool = False
    """Warnings fail too (only affects ``Report.ok`` and the CLI's exit code)."""
    min_busbw_gbps: float | None = None
    """All-reduce bus bandwidth floor; overrides the per-GPU-model table."""
    cpu_procs: int = 2
    """Processes for the all-reduce check on a host without GPUs (gloo on CPU)."""
    timeouts: dict[str, float] = field(default_factory=dict)
    """Per-check timeout overrides in seconds, by check name."""
    cache_paths: list[Path] = field(default_factory=list)
    """More ``.pt`` files or directories to scan for non-CPU tensors."""
    port_fallback: bool = False
    """The caller (``ups launch``) picks a free port itself: a taken port is a warning."""
    env: Mapping[str, str] | None = None
    """Environment to inspect (distributed env, W&B); default ``os.environ``."""
    burn_in: BurnInMode | None = None
    """The burn-in rows (``--burn-in``); default: ``preflight.burn_in`` from the config."""


@dataclass(kw_only=True, slots=True)
class Context:
    """Resolved inputs shared by all checks of one run."""

    opts: PreflightOptions
    cfg: Config | None
    config_path: Path | None
    config_error: str | None = None
    memo: dict[str, Any] = field(default_factory=dict)
    """Measurements several rows share (the burn-in's disk and step figures)."""

    @property
    def burn_in(self) -> BurnInMode:
        if self.opts.burn_in is not None:
            return self.opts.burn_in
        return self.cfg.preflight.burn_in if self.cfg else "off"

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self.opts.env is None else self.opts.env

    @property
    def backend(self) -> str:
        return self.cfg.distributed.backend if self.cfg else "auto"

    @property
    def nproc_per_node(self) -> int | None:
        if self.opts.nproc_per_node is not None:
            return self.opts.nproc_per_node
        return self.cfg.distributed.nproc_per_node if self.cfg else None

    @property
    def expected_gpus(self) -> int | None:
        """GPUs the run needs: explicit, or the worker count when the backend must be nccl."""
        if self.opts.expected_gpus is not None:
            return self.opts.expected_gpus
        if self.backend == "nccl":
            return self.nproc_per_node or 1
        return None

    @property
    def master_port(self) -> int:
        if self.opts.master_port is not None:
            return self.opts.master_port
        return self.cfg.distributed.master_port if self.cfg else DEFAULT_MASTER_PORT

    def timeout(self, name: str, default: float) -> float:
        return self.opts.timeouts.get(name, default)
