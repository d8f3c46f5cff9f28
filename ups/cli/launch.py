"""``ups launch``: preflight, then torchrun; the one way to start training anywhere.

    ups launch CONFIG [--set k=v ...] [--nproc-per-node N] [--nnodes N --node-rank R
               --rdzv-endpoint HOST:PORT] [--run-id ID | --fresh] [--max-restarts N]
               [--allow-resume-change world_size,...] [--skip-preflight] [--dry-run]
               [--log-format {auto,console,json}]
    ups launch --script my_train.py [--output-dir runs] [--stall-timeout S] -- SCRIPT_ARGS...
    ups launch --run-file ups-run.yaml [-- SCRIPT_ARGS...]   (docs/script.md)

Running the same command again continues the latest run of that name when it ended
unfinished for a retryable reason (``ups.retry``); ``--fresh`` starts a new run.

Exit code: the run's (0 finished, 75 preempted, 124 a script that stalled, torchrun's code
on failure); 2 for a bad config or bad flags (reported before anything starts) or a
refused resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ups.outcome import EXIT_CONFIG

if TYPE_CHECKING:
    from ups.config import Config
    from ups.launch.plan import LaunchPlan
    from ups.workload import ScriptWorkload

# Only what the flags need is imported up front: a mistake a user can see from the command
# line alone (a script that does not exist) is answered before the config schema, pydantic,
# rich and the rest are loaded, in a fraction of a second.
LOG_FORMATS = ("auto", "console", "json")
"""``ups.console.LOG_FORMATS`` (a test keeps them equal)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups launch",
        description="Run preflight, then torchrun the trainer (or --script) on this node.",
        epilog="Arguments after `--` go to --script.",
    )
    p.add_argument("config", nargs="?", help="run config YAML (not needed with --script)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set training.epochs=2 (repeatable; the value "
        "is read as YAML)",
    )
    p.add_argument("--nproc-per-node", type=int, help="default: config, else GPUs, else 2")
    p.add_argument(
        "--gpus",
        metavar="I,J,...",
        help="the GPUs this job uses (sets CUDA_VISIBLE_DEVICES for preflight and workers; "
        "--nproc-per-node defaults to their count)",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="how many machines run this job; start `ups launch` on each (default: 1)",
    )
    p.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="this machine's index, 0..NNODES-1; node 0 hosts the rendezvous (default: 0)",
    )
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address (multi-node)")
    p.add_argument(
        "--run-id",
        help="default: run.run_id, $UPS_RUN_ID, the unfinished run behind latest, else new",
    )
    p.add_argument(
        "--fresh", action="store_true", help="start a new run even if the latest can resume"
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restart torchrun in place up to N times after a retryable failure "
        "(default: distributed.max_restarts)",
    )
    p.add_argument(
        "--allow-resume-change",
        metavar="WHAT[,WHAT]",
        help="resume although these differ from the checkpoint: world_size, batch, config, "
        "torch, data (world_size/batch remap the data position)",
    )
    p.add_argument("--output-dir", help="default: run.output_dir from the config, else runs")
    p.add_argument("--master-port", type=int, help="default: distributed.master_port (29500)")
    p.add_argument(
        "--skip-preflight",
        action="store_true",
        help="start torchrun without checking the host first (warned; the data files are "
        "still checked)",
    )
    p.add_argument(
        "--preflight-passed-by",
        metavar="WHO",
        help="preflight already passed on this host for this run (fab deploy sets it)",
    )
    p.add_argument("--preflight-strict", action="store_true", help="preflight warnings stop it")
    p.add_argument(
        "--preflight-skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave out a preflight check or group (repeatable), e.g. allreduce",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
    p.add_argument("--script", help="a torchrun-compatible script to run instead of the trainer")
    p.add_argument(
        "--run-file",
        metavar="FILE",
        help="a run file naming your script, its args, workdir, checkpoint_dir and data "
        "(docs/script.md); the script runs in its workdir",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="end a --script run in which no rank made progress for this long, with every "
        "rank's stack and the odd rank named (default: the run file's stall_timeout_s, "
        "else 300; 0: never)",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="a script's UPS_CHECKPOINT_DIR, instead of the run file's or <run dir>/checkpoints "
        "(relative to where ups launch starts): one directory for every node of a job",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="stdout for people (console: live progress line, tables) or raw JSON lines; "
        "auto: console on a terminal. launch.log and logs/rank<N>.jsonl are always JSON",
    )
    return p


def _select_gpus(gpus: str) -> None:
    """``--gpus 0,1``: restrict this job to those GPUs, as CUDA_VISIBLE_DEVICES does.

    Set here, before torch counts devices, so the default --nproc-per-node, preflight's
    GPU checks and every worker all see the same subset. Raises ValueError.
    """
    ids = [g.strip() for g in gpus.split(",")]
    if not ids or not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
        raise ValueError(
            f"ups launch: --gpus {gpus!r} must list distinct GPU indices, e.g. --gpus 0,1"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
"""Where a GPU driver shows itself (NVIDIA, ROCm, WSL2). With none of them torch sees no
GPU, so launch does not import torch (about 1.5 s of CPU) to count zero."""


def _gpu_count() -> int:
    if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return 0
    import torch

    return int(torch.cuda.device_count())


def _missing_script(script: str) -> str | None:
    """``--script PATH`` that names no file, said in one paragraph (checked first)."""
    if os.path.isfile(script):
        return None
    return (
        f"ups launch: --script {script!r} is not a file (looked in {os.getcwd()}); give the "
        "path of your training script. Nothing was started."
    )


def _from_run_file(args: argparse.Namespace, script_args: list[str]) -> ScriptWorkload:
    """Read ``--run-file`` (every problem at once, WorkloadError), move into its workdir
    (the script's relative paths mean what they mean there) and return it, with
    ``-- ARGS`` in place of its args when given. Secrets from its ``env_file`` join
    this process's environment, which the workers inherit; never the plan's."""
    from ups.workload import WorkloadError, load_run_file, with_args

    if args.script or args.config:
        raise ValueError("ups launch: give --run-file, --script or a CONFIG, not several")
    workload = with_args(load_run_file(Path(args.run_file)), script_args)
    if missing := workload.missing_data():
        raise WorkloadError(
            workload.source,
            [f"data: {d!r} does not exist in workdir {str(workload.workdir)!r}" for d in missing],
        )
    os.environ.update(workload.secrets(os.environ))
    # Where the run lives stays relative to where `ups launch` was started.
    args.output_dir = str(Path(args.output_dir or "runs").absolute())
    checkpoints = args.checkpoint_dir and str(Path(args.checkpoint_dir).absolute())
    os.chdir(workload.workdir)
    if checkpoints:  # --checkpoint-dir: every node of a Slurm job shares node 0's
        workload = dataclasses.replace(workload, checkpoint_dir=checkpoints)
    return workload


def main(argv: list[str]) -> int:
    try:
        ready = _prepare(argv)
    except KeyboardInterrupt:
        # Ctrl-C in the second or two before the run (imports, the config and start
        # checks, planning): nothing was made or started, so there is no outcome to write.
        print("ups launch: stopped by Ctrl-C before anything started", file=sys.stderr)
        return 128 + signal.SIGINT
    if isinstance(ready, int):
        return ready
    return ready.run()


@dataclasses.dataclass(frozen=True, slots=True)
class _Ready:
    """A planned run, its modules imported: what is left is to run it."""

    plan: LaunchPlan
    cfg: Config | None
    gpus: int
    render: bool

    def run(self) -> int:
        from ups.launch.execute import execute  # imported already (``_prepare``)

        return execute(self.plan, self.cfg, gpu_count=self.gpus, render=self.render)


def _prepare(argv: list[str]) -> int | _Ready:
    """Read the flags, check the config or script and plan the run: an exit code (a
    mistake, ``--dry-run``) or the run, ready to start."""
    own, script_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if ("--" in argv) else (argv, [])
    )
    args = _parser().parse_args(own)
    if args.script is not None and (problem := _missing_script(args.script)):
        print(problem, file=sys.stderr)
        return EXIT_CONFIG
    from ups.config import ConfigError, load_config
    from ups.launch.plan import LaunchRequest, build_plan
    from ups.workload import WorkloadError, script_workload

    if args.config and args.output_dir:
        # One place decides where the run lives: the config, which the trainer reads too.
        args.overrides.append(f"run.output_dir={args.output_dir}")
    if args.allow_resume_change:
        # A config field, so the trainer gets it and each attempt's config records it.
        allowed = [w.strip() for w in args.allow_resume_change.split(",") if w.strip()]
        args.overrides.append(f"checkpoint.allow_resume_change=[{','.join(allowed)}]")
    try:
        if args.gpus is not None:
            _select_gpus(args.gpus)
        workload = _from_run_file(args, script_args) if args.run_file is not None else None
        if args.script is not None:
            if args.run_file is not None or args.config:
                raise ValueError("ups launch: give --run-file, --script or a CONFIG, not several")
            script_workload(args.script, script_args)  # a missing script: now, exit 2
        req = LaunchRequest(
            config_path=args.config,
            overrides=args.overrides,
            script=workload.script if workload else args.script,
            script_args=list(workload.args) if workload else script_args,
            checkpoint_dir=workload.checkpoint_dir if workload else args.checkpoint_dir,
            stop_grace_s=workload.stop_grace_s if workload else None,
            checkpoint_sync_url=workload.checkpoint_sync if workload else None,
            checkpoint_sync_endpoint=workload.sync_endpoint if workload else None,
            outputs=list(workload.outputs) if workload else [],
            nproc_per_node=args.nproc_per_node,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            run_id=args.run_id,
            output_dir=args.output_dir,
            master_port=args.master_port,
            skip_preflight=args.skip_preflight,
            preflight_passed_by=args.preflight_passed_by,
            preflight_strict=args.preflight_strict,
            preflight_skip=args.preflight_skip,
            fresh=args.fresh,
            max_restarts=args.max_restarts,
            stall_timeout_s=(
                args.stall_timeout
                if args.stall_timeout is not None
                else workload.stall_timeout_s
                if workload
                else None
            ),
        )
        # Every problem the config check can see (the schema's, a missing data file, a
        # file that does not match its layout, a missing cache directory) is a config error
        # now, all in one report, before a run directory exists or `latest` moves; then
        # what the workers would refuse on this host (fp16 without CUDA, FSDP on a torch
        # without it, a patch that does not divide a grid), in their words. Preflight is
        # for what needs the host probed.
        gpus = _gpu_count()
        cfg: Config | None = None
        if req.config_path is not None:
            from ups.config.faults import with_env_faults
            from ups.data.layouts import inspect_task  # h5py, not torch
            from ups.train.startcheck import start_problems

            cfg = load_config(req.config_path, req.overrides, check_data=inspect_task)
            _, problems = start_problems(with_env_faults(cfg, os.environ), cuda=gpus > 0)
            if problems:
                raise ConfigError(req.config_path, problems)
        from ups.launch.ports import reserve_port
        from ups.preflight import select_checks

        select_checks([], req.preflight_skip)  # unknown check names: a flag error, now

        plan = build_plan(req, cfg, gpu_count=gpus, pick_port=reserve_port)
    except (ConfigError, WorkloadError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        print(plan.to_json())
        return 0
    import ups.launch.execute  # noqa: F401  (imported here, where a Ctrl-C is handled)
    from ups.console import wants_console

    return _Ready(plan, cfg, gpus, wants_console(args.log_format, sys.stdout))
