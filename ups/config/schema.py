"""The run configuration as typed models.

Every model forbids unknown keys and is strict about types, so a typo or a string
where a number belongs is reported with its key path instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ups.runid import validate_run_id

FilePath = Annotated[Path, Field(strict=False)]
"""A path; YAML gives strings, so this one field type is read leniently."""

Layout = Literal["single_1d", "darcy_2d", "groups_2d"]
"""PDEBench file layouts (REFERENCE §3).

- ``single_1d``: ``tensor`` (N, T, X) with ``x-coordinate`` and ``t-coordinate``
  (advection, Burgers). A sample is one frame; the target is the next frame.
- ``darcy_2d``: ``nu`` (N, H, W) and ``tensor`` (N, 1, H, W). Steady: the input is the
  coefficient field ``nu``, the target the solution.
- ``groups_2d``: one group per sample, ``0000/data`` (T, H, W, C) with ``0000/grid/{x,y,t}``
  (diffusion-reaction). A sample is one frame of all C fields; the target is the next.
"""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


RunId = Annotated[str, AfterValidator(validate_run_id)]
"""A run id or run name: it becomes a directory and a word in remote commands (ups.runid)."""


class RunConfig(_Strict):
    name: RunId = "run"
    """Human name of the run; part of the default run id."""
    seed: int = 0
    """Seed for model init, data order and synthetic data; a resumed run replays it exactly."""
    output_dir: FilePath = Path("runs")
    """Run directories are created under this directory: ``output_dir/<run_id>``."""
    run_id: RunId | None = None
    """Fixed run id. Default: ``$UPS_RUN_ID`` or ``<name>-<timestamp>``. Reusing an id resumes."""


class TaskConfig(_Strict):
    name: str
    """Task name, used for the encoder/decoder pair and in metrics (``advection``, ``darcy``...)."""
    layout: Layout
    path: FilePath
    """HDF5 file in PDEBench layout."""
    reduced_resolution: int = Field(1, ge=1)
    """Keep every k-th grid point in each spatial dimension (PDEBench ``reduced_resolution``)."""
    reduced_resolution_t: int = Field(1, ge=1)
    """Keep every k-th frame (PDEBench ``reduced_resolution_t``); ignored for steady tasks."""
    reduced_batch: int = Field(1, ge=1)
    """Keep every k-th sample (PDEBench ``reduced_batch``)."""
    test_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    """Held-out share: the first ``int(N * f)`` samples for single files, the last for groups."""
    weight: float = Field(1.0, gt=0.0)
    """Relative share of this task in each multi-task epoch."""


class ModelConfig(_Strict):
    latent_dim: int = Field(64, ge=8)
    """Width of a latent token."""
    depth: int = Field(2, ge=1)
    """Transformer blocks in the shared operator."""
    heads: int = Field(4, ge=1)
    patch_1d: int = Field(8, ge=1)
    """Grid points per latent token for 1D tasks."""
    patch_2d: int = Field(8, ge=1)
    """Edge of the square patch per latent token for 2D tasks."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.latent_dim % self.heads:
            raise ValueError(
                f"model.latent_dim ({self.latent_dim}) must be divisible by model.heads "
                f"({self.heads})"
            )
        return self


class TrainingConfig(_Strict):
    epochs: int = Field(4, ge=1)
    batch_size: int = Field(32, ge=1)
    """Per-rank batch size."""
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    schedule: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after warm-up: cosine decay to ``min_lr_ratio * lr``, or constant."""
    warmup_steps: int = Field(20, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    grad_clip: float = Field(1.0, ge=0.0)
    """Global grad-norm clip; 0 disables."""
    num_workers: int = Field(0, ge=0)
    """DataLoader worker processes per rank."""
    log_every: int = Field(10, ge=1)
    """Log progress every N optimizer steps."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps in total (for smoke tests); default: all epochs."""
    max_consecutive_skips: int = Field(3, ge=1)
    """Fail the run after this many consecutive steps skipped for out-of-memory."""
    eval_batch_size: int = Field(64, ge=1)
    record_sample_ids: bool = False
    """Log every step's sample indices to the rank's log file (to audit sharding)."""


class DistributedConfig(_Strict):
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """``auto``: nccl when CUDA is available, gloo otherwise."""
    init_timeout_s: float = Field(300.0, gt=0.0)
    """Bound on process-group init and the first step (torchtitan uses 300 s)."""
    collective_timeout_s: float = Field(100.0, gt=0.0)
    """Bound on every collective after the first step; a hung rank fails the job after this."""
    master_port: int = Field(29500, ge=1, le=65535)
    """Preferred master port; ``ups launch`` picks a free one when it is taken."""
    nproc_per_node: int | None = Field(None, ge=1)
    """Workers per node; default: one per visible GPU, or 2 on a CPU-only host."""


class CheckpointConfig(_Strict):
    every_steps: int = Field(100, ge=1)
    keep_last: int = Field(3, ge=1)
    resume: bool = True
    """Resume from the newest good checkpoint in the run directory when one exists."""


class CacheConfig(_Strict):
    enabled: bool = False
    """Train the operator on precomputed latents (encoders frozen) instead of raw grids."""
    dir: FilePath = Path("cache/latents")
    extra_files: list[FilePath] = Field(default_factory=list)
    """Other ``.pt`` files the run loads; preflight checks that they hold CPU tensors only."""


class WandbConfig(_Strict):
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """``auto``: online when ``WANDB_API_KEY`` is set, offline otherwise."""
    project: str = "ups"
    entity: str | None = None


class PreflightConfig(_Strict):
    min_busbw_gbps: float | None = Field(None, gt=0.0)
    """All-reduce bus-bandwidth floor for ``ups-preflight``; default: its per-GPU-model table."""


FaultKind = Literal["oom", "exception", "segfault", "hang", "sigterm"]


class FaultConfig(_Strict):
    """One injected fault, for tests and drills. Never present in a normal config."""

    kind: FaultKind
    rank: int = Field(ge=0)
    step: int = Field(ge=0)
    """The global step (0-based) at whose start the fault fires."""


class Config(_Strict):
    run: RunConfig = RunConfig()
    tasks: list[TaskConfig] = Field(min_length=1)
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    distributed: DistributedConfig = DistributedConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    cache: CacheConfig = CacheConfig()
    wandb: WandbConfig = WandbConfig()
    preflight: PreflightConfig = PreflightConfig()
    faults: list[FaultConfig] = Field(default_factory=list)
    """Fault injection (also ``UPS_FAULTS``); empty in every shipped config."""
