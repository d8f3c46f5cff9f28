"""Build the printable :class:`LaunchPlan`: everything ``ups launch`` will do, decided up front.

Building a plan starts nothing. The only thing it touches is the network stack, to see
whether the configured master port can be bound (and to pick a free one when not), so
the plan shows the port the run will really use. ``--dry-run`` prints the plan.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ups import jsonio
from ups.config import Config
from ups.config.schema import DistributedConfig
from ups.grace import shutdown_timeout_s
from ups.rundir import RunChoice, ScriptRuns, choose_run
from ups.runid import run_id_problem
from ups.workload import checkpoint_dir_problem

TRAINER_MODULE = "ups.train.main"
"""The bundled trainer; torchrun starts it as ``python -m ups.train.main CONFIG``."""
DEFAULT_MASTER_PORT = 29500
DEFAULT_RDZV_TIMEOUT_S = 300
"""How long node agents wait for each other without a config (torch's own default: 600)."""
CPU_NPROC = 2
"""Workers per node on a host without GPUs."""


@dataclass(kw_only=True, slots=True)
class LaunchRequest:
    """What the user asked for on the command line, before any defaults are resolved."""

    config_path: str | None = None
    overrides: list[str] = field(default_factory=list)
    script: str | None = None
    """A torchrun-compatible script to run instead of the bundled trainer."""
    script_args: list[str] = field(default_factory=list)
    checkpoint_dir: str | None = None
    """A script's ``UPS_CHECKPOINT_DIR``; default ``<run dir>/checkpoints``."""
    stop_grace_s: int | None = None
    """A script's time to save after SIGTERM; default ``distributed.stop_grace_s``."""
    checkpoint_sync_url: str | None = None
    """A script's bucket (``s3://bucket/prefix``): its checkpoints go there and come back."""
    checkpoint_sync_endpoint: str | None = None
    outputs: list[str] = field(default_factory=list)
    """A script's other outputs (globs relative to where it runs), brought home with the run."""
    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """``HOST:PORT`` of the rendezvous store; required when ``nnodes > 1``."""
    run_id: str | None = None
    output_dir: str | None = None
    master_port: int | None = None
    skip_preflight: bool = False
    preflight_passed_by: str | None = None
    """Who already ran preflight on this host for this run (e.g. ``fab deploy``): preflight
    is skipped without the warning a bare ``--skip-preflight`` earns."""
    preflight_strict: bool = False
    preflight_skip: list[str] = field(default_factory=list)
    """Preflight checks (or groups) to leave out, e.g. ``allreduce`` on a quick relaunch."""
    fresh: bool = False
    """Start a new run even when the latest one of this name can be resumed."""
    max_restarts: int | None = None
    """In-place restarts after a retryable failure; default ``distributed.max_restarts``."""

    def __post_init__(self) -> None:
        problems = []
        if self.config_path is None and self.script is None:
            problems.append("give a CONFIG file, or --script SCRIPT to run your own script")
        if self.nnodes < 1:
            problems.append(f"--nnodes must be at least 1 (got {self.nnodes})")
        if not 0 <= self.node_rank < max(self.nnodes, 1):
            problems.append(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            problems.append(f"--nproc-per-node must be at least 1 (got {self.nproc_per_node})")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            problems.append(
                "--rdzv-endpoint HOST:PORT is required with --nnodes > 1 "
                "(the address of node 0, where the rendezvous store runs)"
            )
        if self.rdzv_endpoint is not None:
            try:
                split_endpoint(self.rdzv_endpoint)
            except ValueError as exc:
                problems.append(str(exc))
        if self.fresh and self.run_id is not None:
            problems.append("--fresh starts a new run id; it cannot be combined with --run-id")
        if self.max_restarts is not None and self.max_restarts < 0:
            problems.append(f"--max-restarts must be at least 0 (got {self.max_restarts})")
        if self.run_id is not None and (problem := run_id_problem(self.run_id)):
            problems.append(f"--run-id: {problem}")
        if self.script is None and (
            self.checkpoint_dir or self.stop_grace_s or self.checkpoint_sync_url or self.outputs
        ):
            problems.append("a checkpoint dir and stop grace are a script's; no --script was given")
        if self.script_args and self.script is None:
            problems.append("arguments after `--` are passed to --script; no --script was given")
        if problems:
            raise ValueError("ups launch: " + "; ".join(problems))


@dataclass(kw_only=True, slots=True)
class LaunchPlan:
    """Everything one ``ups launch`` node agent will do. Plain data: print it, test it."""

    run_id: str
    run_dir: str
    output_dir: str
    config_path: str | None
    overrides: list[str]
    script: str | None
    """None: the bundled trainer (``python -m ups.train.main``)."""
    worker_argv: list[str]
    """What torchrun runs in each worker, after ``python``."""
    nproc_per_node: int
    nproc_source: str
    """Where ``nproc_per_node`` came from: flag, config, gpus or cpu-default."""
    nnodes: int
    node_rank: int
    world_size: int
    rdzv_endpoint: str
    rdzv_host: bool
    """True when this node hosts the rendezvous store (node rank 0)."""
    master_port_preferred: int
    master_port: int
    """The rendezvous store's port on node 0; workers get it as ``MASTER_PORT``."""
    port_note: str | None
    """Why ``master_port`` differs from the preferred one, when it does."""
    port_fixed: bool
    """The port came with ``--rdzv-endpoint``: other nodes use it too, so it cannot move."""
    torchrun_argv: list[str]
    env: dict[str, str]
    """Variables launch adds to (or defaults in) the workers' environment."""
    preflight: bool
    preflight_passed_by: str | None
    preflight_strict: bool
    preflight_skip: list[str]
    log_path: str
    result_path: str
    """Where the torchrun child writes its small JSON result (failures by rank)."""
    stop_grace_s: int
    """torchrun's ``--shutdown-timeout``: the workers' time to save after SIGTERM."""
    checkpoint_sync_url: str | None
    """A script's bucket: launch uploads its checkpoints and restores the newest one."""
    checkpoint_sync_endpoint: str | None
    workdir: str
    """Where the workers run (a run file's workdir): a script's relative paths start here."""
    script_outputs: list[str]
    """A script's ``outputs`` globs, relative to ``workdir``."""
    max_restarts: int
    restart_backoff_s: float
    resume: dict[str, Any] | None
    """The unfinished run this launch continues (run_id, step, checkpoint, why), if any."""
    resume_note: str | None
    """Why the latest run of this name is not continued, when it is not."""

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def to_json(self) -> str:
        return jsonio.dumps(asdict(self), indent=2, sort_keys=True)

    def with_master_port(self, port: int, note: str) -> LaunchPlan:
        """The same plan on another master port (torchrun found this one taken)."""
        assert not self.port_fixed, "a shared --rdzv-endpoint cannot move"
        host, _ = split_endpoint(self.rdzv_endpoint)
        endpoint = f"{host}:{port}"
        argv = list(self.torchrun_argv)
        at = next(i for i, a in enumerate(argv) if a.startswith("--rdzv-endpoint="))
        argv[at] = f"--rdzv-endpoint={endpoint}"  # torchrun's own flag, not a script's
        return replace(
            self, rdzv_endpoint=endpoint, master_port=port, port_note=note, torchrun_argv=argv
        )


def torchelastic_dir(run_dir: str | Path) -> Path:
    """Where torchrun's files for this run live (results, per-rank outputs, error files)."""
    return Path(run_dir) / "torchelastic"


def rank_log_dir(run_dir: str | Path, node_rank: int) -> Path:
    """torchrun's ``--log-dir`` on one node. Per node: the nodes of a run may share the run
    directory (one filesystem), and torchrun names its folder after the run id alone."""
    return torchelastic_dir(run_dir) / f"node{node_rank}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 as ``[::1]:PORT``). Raises ValueError with the fix."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--rdzv-endpoint {endpoint!r} must be HOST:PORT, e.g. 10.0.0.1:29500")
    return host, int(port)


def _resolve_run_id(
    req: LaunchRequest, cfg: Config | None, output_dir: Path, environ: Mapping[str, str]
) -> RunChoice:
    """``--run-id`` > ``run.run_id`` > ``$UPS_RUN_ID`` > the unfinished run behind ``latest``
    (so running the same command again resumes it; not with ``--fresh``) > a new id."""
    fixed = req.run_id or (cfg.run.run_id if cfg else None) or environ.get("UPS_RUN_ID")
    if not fixed and req.nnodes > 1:
        raise ValueError(
            "ups launch: a multi-node run needs the same run id on every node; "
            "pass --run-id ID (or set run.run_id / UPS_RUN_ID) on each node"
        )
    name = cfg.run.name if cfg else Path(req.script or "run").stem
    script = None
    if req.script is not None:
        script = ScriptRuns(Path(req.checkpoint_dir) if req.checkpoint_dir else None)
    return choose_run(output_dir, name, fixed, fresh=req.fresh, script=script)


def _resolve_nproc(req: LaunchRequest, cfg: Config | None, gpu_count: int) -> tuple[int, str]:
    if req.nproc_per_node is not None:
        return req.nproc_per_node, "flag"
    if cfg is not None and cfg.distributed.nproc_per_node is not None:
        return cfg.distributed.nproc_per_node, "config"
    if gpu_count > 0:
        return gpu_count, "gpus"
    return CPU_NPROC, "cpu-default"


def _worker_env(
    run_id: str, run_dir: str, gpu_count: int, environ: Mapping[str, str]
) -> dict[str, str]:
    env = {
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        # 3 (tear down without abort) is torch's default; set it so a user's stale 0 cannot
        # turn a dead peer into a hang.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
        "UPS_RUN_ID": run_id,
        "UPS_RUN_DIR": run_dir,
    }
    if gpu_count == 0 and "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = "1"
    if gpu_count > 0:
        # NCCL flight recorder: on a collective timeout each rank dumps its last collectives
        # to <run_dir>/nccl_trace/rank_<N> (read with `torchfrtrace`). Needs error handling 3.
        recorder = {
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{run_dir}/nccl_trace/rank_",
        }
        env.update({key: environ.get(key, value) for key, value in recorder.items()})
    return env


def _script_env(req: LaunchRequest, run_dir: Path, output_dir: Path) -> dict[str, str]:
    """A script's checkpoint directory (``UPS_RESUME`` is set as each attempt starts).
    Raises ValueError when it is where the script runs or holds ups's runs."""
    if req.script is None:
        return {}
    directory = Path(req.checkpoint_dir) if req.checkpoint_dir else run_dir / "checkpoints"
    if problem := checkpoint_dir_problem(directory, Path.cwd(), output_dir):
        raise ValueError(f"ups launch: {problem}")
    return {"UPS_CHECKPOINT_DIR": str(directory.absolute())}


def build_plan(
    req: LaunchRequest,
    cfg: Config | None,
    *,
    gpu_count: int,
    pick_port: Callable[[int], int],
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """Resolve every default and decide ports, ids, argv and env. Raises ValueError.

    ``pick_port(preferred)`` returns ``preferred`` when it can be bound, else a free port
    (``ups.preflight.checks.ports.pick_free_port``); only the node hosting the store uses it.
    """
    environ = os.environ if environ is None else environ
    output_dir = Path(req.output_dir or (cfg.run.output_dir if cfg else "runs"))
    choice = _resolve_run_id(req, cfg, output_dir, environ)
    run_id = choice.run_id
    run_dir = output_dir / run_id
    script_env = _script_env(req, run_dir, output_dir)
    nproc, nproc_source = _resolve_nproc(req, cfg, gpu_count)

    preferred = req.master_port or (cfg.distributed.master_port if cfg else DEFAULT_MASTER_PORT)
    host, port, rdzv_host, port_note = _rendezvous(req, preferred, pick_port)
    if req.rdzv_endpoint:
        preferred = port  # the shared endpoint's port is the one asked for
    endpoint = f"{host}:{port}"
    worker_argv = _worker_argv(req, run_id)
    dcfg = cfg.distributed if cfg else DistributedConfig()
    grace = shutdown_timeout_s(req.stop_grace_s or dcfg.stop_grace_s)
    rdzv_timeout = int(cfg.distributed.init_timeout_s) if cfg else DEFAULT_RDZV_TIMEOUT_S
    torchrun_argv = _torchrun_argv(
        req, nproc, endpoint, run_id, run_dir, rdzv_timeout, grace, worker_argv
    )
    return LaunchPlan(
        run_id=run_id,
        run_dir=str(run_dir),
        output_dir=str(output_dir),
        config_path=req.config_path,
        overrides=list(req.overrides),
        script=req.script,
        worker_argv=worker_argv,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        nnodes=req.nnodes,
        node_rank=req.node_rank,
        world_size=nproc * req.nnodes,
        rdzv_endpoint=endpoint,
        rdzv_host=rdzv_host,
        master_port_preferred=preferred,
        master_port=port,
        port_note=port_note,
        port_fixed=req.rdzv_endpoint is not None,
        torchrun_argv=torchrun_argv,
        env=_worker_env(run_id, str(run_dir), gpu_count, environ) | script_env,
        preflight=not (req.skip_preflight or req.preflight_passed_by),
        preflight_passed_by=req.preflight_passed_by,
        preflight_strict=req.preflight_strict,
        preflight_skip=list(req.preflight_skip),
        log_path=str(run_dir / "logs" / "launch.log"),
        result_path=str(torchelastic_dir(run_dir) / f"node{req.node_rank}-result.json"),
        stop_grace_s=grace,
        checkpoint_sync_url=req.checkpoint_sync_url,
        checkpoint_sync_endpoint=req.checkpoint_sync_endpoint,
        workdir=str(Path.cwd()),
        script_outputs=list(req.outputs),
        max_restarts=dcfg.max_restarts if req.max_restarts is None else req.max_restarts,
        restart_backoff_s=dcfg.restart_backoff_s,
        resume=asdict(choice.resume) if choice.resume else None,
        resume_note=choice.note,
    )


def _rendezvous(
    req: LaunchRequest, preferred: int, pick_port: Callable[[int], int]
) -> tuple[str, int, bool, str | None]:
    """(host, port, whether this node hosts the store, a note when the port moved)."""
    if req.rdzv_endpoint:
        # The endpoint is shared with the other nodes: it cannot be changed here. Preflight
        # checks that node 0 can bind it.
        host, port = split_endpoint(req.rdzv_endpoint)
        return host, port, req.node_rank == 0, None
    port = pick_port(preferred)
    note = f"port {preferred} is taken; using free port {port}" if port != preferred else None
    return "127.0.0.1", port, True, note


def _torchrun_argv(
    req: LaunchRequest,
    nproc: int,
    endpoint: str,
    run_id: str,
    run_dir: Path,
    rdzv_timeout: int,
    grace: int,
    worker_argv: list[str],
) -> list[str]:
    # Static rendezvous: node N is group rank N and global ranks follow node order, so
    # rank 0 (outcome.json, W&B) is always on node 0, and MASTER_PORT is exactly the port
    # checked above. (c10d rendezvous orders nodes by address and pid, and gives workers
    # a second, random master port.) Node 0's agent hosts the store on that port.
    return [
        f"--nnodes={req.nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={req.node_rank}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        # A node whose peers never come fails after this instead of waiting torch's 600 s.
        f"--rdzv-conf=timeout={rdzv_timeout}",
        f"--log-dir={rank_log_dir(run_dir, req.node_rank)}",
        # Each rank's stdout and stderr to files of its own, which launch follows and merges
        # whole lines at a time (ups.launch.ranklogs): ranks sharing a pipe split lines.
        "--redirects=3",
        # In-place restarts are launch's (--max-restarts): it reads the outcome between
        # attempts and restarts only for retryable causes (ups.retry).
        "--max-restarts=0",
        # SIGTERM -> the workers get this long to stop at a step and save (ups.grace).
        f"--shutdown-timeout={grace}",
        *worker_argv,
    ]


def _worker_argv(req: LaunchRequest, run_id: str) -> list[str]:
    if req.script is not None:
        return [req.script, *req.script_args]
    assert req.config_path is not None  # LaunchRequest guarantees a config or a script
    sets: Sequence[str] = [*req.overrides, f"run.run_id={run_id}"]
    return ["-m", TRAINER_MODULE, req.config_path, *(a for s in sets for a in ("--set", s))]
