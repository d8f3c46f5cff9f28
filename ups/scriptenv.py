"""The environment every rank of a run starts with: the one list.

``ups launch`` (``ups.launch.plan``, ``ups.launch.torchrun``, ``ups.launch.scriptrun``)
sets these; torchrun adds its own. docs/reference/environment.md is generated from
:data:`TABLE`, and tests/test_docs_reference.py builds real launch plans and fails when one
sets a variable this list does not describe. The checkpoint contract's names live in
:mod:`ups.ckpt` (a script may copy that module), and are taken from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ups import ckpt, stackdump

Who = Literal["ups", "torchrun"]
When = Literal["every run", "a script's run", "a watched script's run", "CPU hosts", "GPU hosts"]


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str
    """What it holds, for people."""
    when: When
    """Which runs get it: every run, only your own script's (``--script``/``--run-file``),
    only a script's watched for stalls (``--stall-timeout`` not 0), or only on hosts with
    or without GPUs."""
    set_by: Who = "ups"
    kept: bool = False
    """A value already in the environment wins over ups's default."""


RUN_ID = EnvVar(ckpt.ENV_RUN_ID, "the run's id (`runs/<id>/`); the same on every node", "every run")
RUN_DIR = EnvVar("UPS_RUN_DIR", "the run directory, where `outcome.json` and logs go", "every run")
ATTEMPT = EnvVar(
    "UPS_ATTEMPT",
    "this torchrun attempt of the launch: 1, then 2, ... after `--max-restarts` restarts",
    "every run",
)
CHECKPOINT_DIR = EnvVar(
    ckpt.ENV_DIR,
    "an absolute directory to save checkpoints in (the run file's `checkpoint_dir`, else "
    "`<run dir>/checkpoints`); a checkpoint counts once committed (docs/script.md)",
    "a script's run",
)
RESUME = EnvVar(
    ckpt.ENV_RESUME,
    "the newest committed checkpoint in the checkpoint directory when this attempt started "
    "(restored from the bucket first with `checkpoint_sync`), or empty: start from scratch",
    "a script's run",
)
PROGRESS_DIR = EnvVar(
    ckpt.ENV_PROGRESS,
    "where `ups.ckpt`'s `should_stop`, `commit` and `progress` leave each rank's heartbeat "
    "(`rank<N>`): the stall watch reads them as progress",
    "a watched script's run",
)
STACK_DIR = EnvVar(
    stackdump.ENV_STACK_DIR,
    "where each rank writes its Python stacks (`rank<N>.txt`) when ups asks, on a stall",
    "a watched script's run",
)
TABLE: tuple[EnvVar, ...] = (
    RUN_ID,
    RUN_DIR,
    ATTEMPT,
    CHECKPOINT_DIR,
    RESUME,
    PROGRESS_DIR,
    STACK_DIR,
    EnvVar(
        "PYTHONPATH",
        "ups's stack hook first (a `sitecustomize.py` that answers a stack request, then runs "
        "any `sitecustomize` of yours), then your own `PYTHONPATH`",
        "a watched script's run",
    ),
    EnvVar(
        stackdump.ENV_HOOKED,
        "set by that hook in the rank it hooked (its pid), so the rank's own children "
        "(DataLoader workers) do not hook again",
        "a watched script's run",
    ),
    EnvVar(
        "PYTHONUNBUFFERED", "`1`: every line reaches the run's log as it is printed", "every run"
    ),
    EnvVar(
        "PYTHONFAULTHANDLER",
        "`1`: a crash (SIGSEGV, SIGBUS...) writes the Python stack of every thread to the "
        "rank's log",
        "every run",
    ),
    EnvVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "`3`: a dead peer tears the process group down instead of hanging it",
        "every run",
        kept=True,
    ),
    EnvVar(
        "OMP_NUM_THREADS",
        "`1`: ranks sharing a CPU host do not each start a thread per core",
        "CPU hosts",
        kept=True,
    ),
    EnvVar(
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "`2000`: the NCCL flight recorder keeps each rank's last collectives",
        "GPU hosts",
        kept=True,
    ),
    EnvVar(
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "`1`: on a collective timeout each rank dumps them (read with `torchfrtrace`)",
        "GPU hosts",
        kept=True,
    ),
    EnvVar(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "`<run dir>/nccl_trace/rank_`: where those dumps go",
        "GPU hosts",
        kept=True,
    ),
    EnvVar("RANK", "the global rank, 0 to WORLD_SIZE-1", "every run", "torchrun"),
    EnvVar("LOCAL_RANK", "the rank on this node (the GPU index to use)", "every run", "torchrun"),
    EnvVar("WORLD_SIZE", "ranks in the run, on all nodes", "every run", "torchrun"),
    EnvVar("LOCAL_WORLD_SIZE", "ranks on this node", "every run", "torchrun"),
    EnvVar(
        "MASTER_ADDR",
        "the rendezvous host (node 0); `init_process_group` reads it",
        "every run",
        "torchrun",
    ),
    EnvVar(
        "MASTER_PORT",
        "the rendezvous port preflight checked (ups moves it off a taken port)",
        "every run",
        "torchrun",
    ),
    EnvVar(
        "TORCHELASTIC_RESTART_COUNT",
        "restarts of the workers within this torchrun (always 0: ups restarts torchrun "
        "itself, see UPS_ATTEMPT)",
        "every run",
        "torchrun",
    ),
)
BY_NAME = {var.name: var for var in TABLE}
RESERVED = tuple(var.name for var in TABLE if var.name.startswith("UPS_"))
"""Names a run file's ``env`` may not pass: ups sets them for every rank."""
