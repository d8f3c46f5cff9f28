"""The run configuration as typed models.

Every model forbids unknown keys and is strict about types, so a typo or a string
where a number belongs is reported with its key path instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ups.bucket.store import parse_url
from ups.grace import DEFAULT_STOP_GRACE_S
from ups.runid import validate_run_id

FilePath = Annotated[Path, Field(strict=False)]
"""A path; YAML gives strings, so this one field type is read leniently."""

Layout = Literal["single_1d", "darcy_2d", "groups_2d"]
"""PDEBench file layouts (docs/trainer.md, Data).

- ``single_1d``: ``tensor`` (N, T, X) with ``x-coordinate`` and ``t-coordinate``
  (advection, Burgers). A sample is one frame; the target is the next frame.
- ``darcy_2d``: ``nu`` (N, H, W) and ``tensor`` (N, 1, H, W). Steady: the input is the
  coefficient field ``nu``, the target the solution.
- ``groups_2d``: one group per sample, ``0000/data`` (T, H, W, C) with ``0000/grid/{x,y,t}``
  (diffusion-reaction). A sample is one frame of all C fields; the target is the next.
"""


class _Strict(BaseModel):
    # The docstring under each field is its description (docs/reference/config.md).
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
    """How the HDF5 file is organised: ``single_1d``, ``darcy_2d`` or ``groups_2d`` (see Layout)."""
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
    """Attention heads per block; must divide ``latent_dim``."""
    patch_1d: int = Field(8, ge=1)
    """Grid points per latent token for 1D tasks."""
    patch_2d: int = Field(8, ge=1)
    """Edge of the square patch per latent token for 2D tasks."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability inside the operator's blocks; 0 disables it."""

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
    """Passes over the training data (the run's length unless ``max_steps`` is set)."""
    batch_size: int = Field(32, ge=1)
    """Per-rank batch size."""
    lr: float = Field(1e-3, gt=0.0)
    """Peak learning rate (AdamW), reached at the end of warm-up."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after warm-up: cosine decay to ``min_lr_ratio * lr``, or constant."""
    warmup_steps: int = Field(20, ge=0)
    """Optimizer steps of linear warm-up from ``lr / warmup_steps`` to ``lr``."""
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """Where the cosine schedule ends, as a fraction of ``lr``."""
    grad_clip: float = Field(1.0, ge=0.0)
    """Global grad-norm clip; 0 disables."""
    num_workers: int = Field(0, ge=0)
    """DataLoader worker processes per rank; 0 reads in the training process. Each worker
    reads whole steps (one batch of every task) and opens the HDF5 files itself; the batch
    order is the same with any number of workers, so a resumed run may change it."""
    prefetch_factor: int = Field(2, ge=1)
    """Steps each worker reads ahead (with ``num_workers > 0``). Every step in flight sits
    in /dev/shm: ``num_workers * prefetch_factor`` of them per rank (``ups preflight``'s
    ``shm`` check counts them)."""
    pin_memory: bool | Literal["auto"] = "auto"
    """Page-locked batches, copied to the GPU faster; ``auto``: on when training on CUDA."""
    persistent_workers: bool = True
    """Keep the workers between epochs instead of starting (forking, opening files,
    preloading) them again each epoch; they end with the training loop either way."""
    log_every: int = Field(10, ge=1)
    """Log progress every N optimizer steps."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps in total (for smoke tests); default: all epochs."""
    max_consecutive_skips: int = Field(3, ge=1)
    """Fail the run after this many consecutive skipped steps (out of memory, non-finite)."""
    nonfinite: Literal["fail", "skip"] = "fail"
    """A NaN/inf loss or gradient on any rank: ``fail`` ends the run at that step on every
    rank (outcome failed, no update applied); ``skip`` skips the step on every rank."""
    eval_batch_size: int = Field(64, ge=1)
    """Per-rank batch size of the held-out evaluation at the end of the run."""
    record_sample_ids: bool = False
    """Log every step's sample indices to the rank's log file (to audit sharding)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """``ddp``: a full replica per rank. ``fsdp``: FSDP2 (``fully_shard``): parameters,
    gradients and AdamW state sharded between steps, sharded checkpoints (resume needs the
    same world size; ``ups checkpoint export RUN`` writes one consolidated file)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Forward precision under ``torch.autocast``: ``fp32`` (no autocast), ``bf16``, or
    ``fp16`` (CUDA only) with a loss scaler whose overflow check is the step's non-finite
    flag. Parameters, gradients, the optimizer and the evaluation stay fp32."""
    compile: bool = False
    """``torch.compile`` the model. Compiled once before the first step on every rank; a
    failure (e.g. no C++ compiler on a CPU host: ``apt-get install build-essential``) stops
    every rank with the fix named."""
    accum_steps: int = Field(1, ge=1)
    """Micro-batches of ``batch_size`` per optimizer step (gradient accumulation): each
    rank takes ``batch_size * accum_steps`` samples per step. Steps, ``max_steps``,
    ``log_every`` and checkpoints count optimizer steps."""
    oom_policy: Literal["skip", "fail"] = "skip"
    """Out of memory on a rank: ``skip`` the step on every rank (local backward, then the
    ranks agree before any gradient is sent); ``fail`` ends the run (DDP's bucketed
    all-reduce overlaps the backward; a rank that runs out of memory exits and the others
    fail within ``distributed.collective_timeout_s``). See docs/training.md."""

    @model_validator(mode="after")
    def _fsdp_combinations(self) -> TrainingConfig:
        if self.strategy != "fsdp":
            return self
        unsupported = {
            "oom_policy=fail": self.oom_policy == "fail",
            "compile=true": self.compile,
            "precision=fp16": self.precision == "fp16",
        }
        if chosen := [name for name, on in unsupported.items() if on]:
            raise ValueError(
                f"training.strategy=fsdp does not support training.{', training.'.join(chosen)}"
                " yet: FSDP's one all-gather per step and gradient all-reduce after the"
                " agreement (docs/fsdp.md) are built and tested with oom_policy=skip,"
                " compile=false and precision fp32 or bf16; use those, or strategy=ddp"
            )
        return self


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
    stop_grace_s: float = Field(float(DEFAULT_STOP_GRACE_S), gt=0.0)
    """Seconds the workers get after SIGTERM to stop at a step and write the checkpoint,
    before torchrun SIGKILLs them (its ``--shutdown-timeout``). The container's
    ``stop_grace_period`` and ``fab stop``'s wait are derived from the default
    (``ups.grace``); raise them with it."""
    max_restarts: int = Field(0, ge=0)
    """In-place restarts of torchrun from the last checkpoint after a retryable failure
    (``ups.retry``); ``--max-restarts`` overrides."""
    restart_backoff_s: float = Field(10.0, ge=0.0)
    """Wait before the first in-place restart; doubled for each next one (at most 300 s)."""

    def on_cuda(self, cuda_visible: bool) -> bool:
        """Whether a run trains on CUDA, where a CUDA device is (``cuda_visible``) or is not
        visible: ``gloo`` keeps it on the CPU (``ups.distributed.process_group.uses_cuda``)."""
        return cuda_visible and self.backend != "gloo"


ResumeChange = Literal["world_size", "batch", "config", "torch", "data"]
"""Groups of facts a checkpoint records (see ``ups.train.resume``)."""


class CheckpointConfig(_Strict):
    every_steps: int = Field(100, ge=1)
    """Write a checkpoint every N steps (and always at the end or on preemption)."""
    keep_last: int = Field(3, ge=1)
    """Checkpoints kept in the run directory; older ones are deleted."""
    resume: bool = True
    """Resume from the newest good checkpoint in the run directory when one exists."""
    allow_resume_change: list[ResumeChange] = Field(default_factory=list)
    """What a resume may change from the checkpoint's run (``--allow-resume-change``);
    anything else that differs is refused. ``world_size``/``batch`` remap the data position."""


def _bucket_url(url: str | None) -> str | None:
    if url is not None:
        parse_url(url)  # raises ValueError naming the form to write
    return url


class CheckpointSyncConfig(_Strict):
    """Checkpoints leave the host as they are written (docs/managed-runs.md)."""

    url: Annotated[str | None, AfterValidator(_bucket_url)] = None
    """``s3://bucket/prefix``: rank 0 uploads every committed checkpoint (digest or
    manifest last), the logs, ``outcome.json`` and the W&B offline directory to
    ``<url>/<run_id>/`` in the background; ``checkpoint.keep_last`` applies there too.
    Credentials: boto3's chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
    ``AWS_PROFILE``, ``AWS_SHARED_CREDENTIALS_FILE``). Default: off."""
    endpoint_url: str | None = None
    """The S3 API endpoint of a store other than AWS (R2, B2, MinIO...), e.g.
    ``https://<account>.r2.cloudflarestorage.com``; default: AWS, or ``AWS_ENDPOINT_URL``."""
    flush_timeout_s: float = Field(300.0, ge=0.0)
    """At the end of the run, how long rank 0 waits for uploads still in flight (the
    outcome says what was not uploaded)."""
    resume: bool = True
    """With ``checkpoint.resume``: when the bucket holds a newer committed checkpoint of
    this run id than the run directory (a new host), fetch it and resume from it."""
    credentials: Literal["auto", "scoped", "account"] = "auto"
    """What a host that ``fab deploy`` sets up gets to reach the bucket (docs/security.md):
    ``scoped``: credentials minted for this run (AWS STS), limited to ``<url>/<run_id>/``
    and short-lived; ``account``: this machine's own S3 keys. ``auto``: scoped on a rented
    (Vast) host, account on your own hosts."""
    role_arn: str | None = None
    """Mint scoped credentials with STS ``AssumeRole`` on this role (MinIO: any ARN)
    instead of ``GetFederationToken`` (which needs an IAM user's long-term keys)."""
    credentials_hours: float | None = Field(None, ge=0.25, le=36.0)
    """Lifetime of scoped credentials; default: the run's ``max_hours`` plus 30 minutes,
    at most what the store allows (36 h for GetFederationToken, 1 h for AssumeRole)."""
    renew_before_s: float | None = Field(None, gt=0.0)
    """The supervisor renews scoped credentials on the host when less than this is left
    of them; default: half their lifetime."""


class CacheConfig(_Strict):
    enabled: bool = False
    """Train the operator on precomputed latents (encoders frozen) instead of raw grids."""
    dir: FilePath = Path("cache/latents")
    """Where ``ups cache build`` writes the latents (a ``.pt`` per task) and training reads them."""
    extra_files: list[FilePath] = Field(default_factory=list)
    """Other ``.pt`` files the run loads; preflight checks that they hold CPU tensors only."""


class WandbConfig(_Strict):
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """``auto``: online when ``WANDB_API_KEY`` is set, offline otherwise."""
    project: str = "ups"
    """W&B project the run is logged to."""
    entity: str | None = None
    """W&B team or user; default: the API key's default entity."""
    online_on_host: bool = False
    """On a rented (Vast) host, log online there, which sends ``WANDB_API_KEY`` to it.
    Default: the run logs offline there (no key on the host) and the W&B directory is
    synced from this machine when it comes home (docs/security.md)."""


BurnInMode = Literal["off", "warn", "enforce"]
"""``off``: no burn-in rows; ``warn``: rows below the floor warn; ``enforce``: they fail."""
Figure = Literal["matmul", "h2d", "busbw", "disk_write", "disk_read", "loader", "step"]
"""The burn-in's figures (docs/burn-in.md): each is one preflight row."""


class PreflightConfig(_Strict):
    min_busbw_gbps: float | None = Field(None, gt=0.0)
    """All-reduce bus-bandwidth floor for ``ups-preflight``; default: its per-GPU-model table."""
    burn_in: BurnInMode = "off"
    """Measure this host before training (docs/burn-in.md): matmul, host-device copies,
    disk, the data loader and a few warm steps of this run's model. A rented Vast host
    runs it as ``enforce`` unless its hosts.yaml entry says otherwise."""
    burn_in_floor: float = Field(0.7, gt=0.0, le=1.0)
    """A figure below this fraction of its known-good value is below the floor."""
    known_good: dict[Figure, Annotated[float, Field(gt=0.0)]] = Field(default_factory=dict)
    """Known-good values that replace the GPU table's (or give one where it has none),
    in each row's unit: ``step: 1200`` (samples/s of this run's model and batch)."""


FaultKind = Literal[
    "oom",
    "exception",
    "segfault",
    "hang",
    "sigterm",
    "sigkill",
    "slow_save",
    "nan",
    "alloc",
    "pause",
]
"""``oom`` raises ``torch.OutOfMemoryError`` without allocating; ``alloc`` (CUDA only) holds
half of the device's free memory and then asks its allocator for more than is left, so the
error is the allocator's own and the held block must be released by the skip.
``sigkill``: the rank sends itself SIGKILL (as the OOM killer or ``docker kill`` would);
at point ``loader`` the DataLoader worker reading that step does (``segfault`` likewise).
``slow_save`` makes every checkpoint write from that step on take 35 s longer (more
than torchrun's default 30 s shutdown timeout), to drill preemption with a slow disk.
``nan`` makes this rank's loss NaN in that step (the others stay finite).
``pause`` holds the rank, asleep, at the start of that step until the run is asked to stop
(SIGTERM), then lets it finish the step: a run held mid-training without using the CPU,
for drills that stop it from outside (``fab stop``, the Vast watchdog). Give it to every
rank at the same step: a rank that goes on waits for the others in the step's first
collective, and its timeout ends the run."""
FaultPoint = Literal[
    "start", "forward", "backward", "pack", "clip", "optimizer", "scheduler", "loader"
]
"""Where in a step a fault fires: ``loader`` (in the DataLoader worker as it reads that
step's batch, ahead of training; the training process when ``num_workers`` is 0),
``start`` (before any work), or just before the forward,
the backward, packing gradients into the all-reduce buffer, clipping, the optimizer step
or the scheduler step."""


class FaultConfig(_Strict):
    """One injected fault, for tests and drills. Never present in a normal config."""

    kind: FaultKind
    """What happens: out-of-memory, an exception, a segfault, a hang, or a SIGTERM."""
    rank: int = Field(ge=0)
    """The rank the fault fires on."""
    step: int = Field(ge=0)
    """The global step (0-based) in which the fault fires."""
    point: FaultPoint = "start"
    """Where in the step it fires: ``start``, ``forward``, ``backward``, ``pack``, ``clip``,
    ``optimizer``, ``scheduler``, or ``loader`` (see FaultPoint)."""

    @model_validator(mode="after")
    def _pause_in_the_step(self) -> FaultConfig:
        if self.kind == "pause" and self.point == "loader":
            raise ValueError(
                "kind pause holds the training process until it is asked to stop; give it a "
                "point inside the step (start, the default), not loader"
            )
        return self


class Config(_Strict):
    run: RunConfig = RunConfig()
    """Name, seed, run id and where run directories go."""
    tasks: list[TaskConfig] = Field(min_length=1)
    """The PDE datasets trained on together (at least one)."""
    model: ModelConfig = ModelConfig()
    """Size of the shared latent operator and its per-task encoders/decoders."""
    training: TrainingConfig = TrainingConfig()
    """Optimizer, schedule, batch sizes, run length and logging cadence."""
    distributed: DistributedConfig = DistributedConfig()
    """Backend, timeouts, master port and workers per node."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often checkpoints are written, how many are kept, and resuming."""
    checkpoint_sync: CheckpointSyncConfig = CheckpointSyncConfig()
    """Uploading checkpoints, logs and the outcome to an S3-compatible bucket."""
    cache: CacheConfig = CacheConfig()
    """Training on precomputed latents instead of raw grids."""
    wandb: WandbConfig = WandbConfig()
    """Experiment tracking (online, offline or disabled)."""
    preflight: PreflightConfig = PreflightConfig()
    """Thresholds for ``ups-preflight``."""
    faults: list[FaultConfig] = Field(default_factory=list)
    """Fault injection (also ``UPS_FAULTS``); empty in every shipped config."""
