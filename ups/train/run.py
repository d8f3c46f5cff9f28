"""One training run from process group to outcome: the only place that decides how it ended."""

from __future__ import annotations

import dataclasses
import faulthandler
import hashlib
from pathlib import Path
from typing import IO, Any

import structlog
import torch
import torch.distributed as dist
import yaml

from ups.bucket.uploader import Uploader
from ups.config import Config
from ups.data.loader import MultiTaskLoader, build_loader
from ups.data.pdebench import PDEBenchDataset, TaskInfo
from ups.distributed.agreement import (
    publish_failure,
    publish_whereabouts,
    published_failures,
    stuck_ranks,
)
from ups.distributed.env import DistEnv
from ups.distributed.process_group import (
    init_distributed,
    shutdown_distributed,
)
from ups.distributed.stacks import dump_stack_of, enable_stack_dumps
from ups.fsio import atomic_write_text
from ups.log import setup_logging
from ups.model import LatentOperator, build_model, task_shapes
from ups.outcome import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    Outcome,
    write_outcome,
)
from ups.retry import resume_hint
from ups.rundir import mark_latest, resolve_run_id
from ups.train.bucket_sync import (
    final_sync_timeout,
    flush_checkpoints,
    start_sync,
)
from ups.train.cache import load_cache
from ups.train.compile import compile_check, compile_model
from ups.train.evaluate import evaluate
from ups.train.failures import RunFailed, nonfinite_metrics
from ups.train.faults import FaultInjector
from ups.train.loop import Trainer
from ups.train.metrics import mean_target, output_scale
from ups.train.resume import (
    FACTS_KEY,
    ResumeRefused,
    check_resume,
    remapped_step,
    restore_rng,
    rng_state,
    run_facts,
    strategy_refusal,
)
from ups.train.schedule import TrainState, lr_schedule, total_steps
from ups.train.sharded import other_format_checkpoint
from ups.train.signals import StopFlag
from ups.train.strategies import make_strategy
from ups.train.tracking import Tracker
from ups.worker_death import LOADER_DIED, worker_death

log = structlog.get_logger()
_fault_log: IO[str] | None = None  # kept open for faulthandler for the life of the process


def make_model(cfg: Config, infos: dict[str, TaskInfo]) -> LatentOperator:
    """The model for these tasks, its decoders fitted to each task's training targets."""
    scales, offsets = {}, {}
    for t in cfg.tasks:
        info = infos[t.name]
        train = PDEBenchDataset(t, "train", info)
        if info.steady:
            offsets[t.name] = mean_target(train)
        scales[t.name] = output_scale(train, info.steady, offsets.get(t.name))
    return build_model(task_shapes(infos, scales, offsets), cfg.model)


def build_trainer(
    cfg: Config,
    env: DistEnv,
    infos: dict[str, TaskInfo],
    device: torch.device,
    *,
    loader: MultiTaskLoader,
    tracker: Tracker,
    stop: StopFlag,
    checkpoint_dir: Path,
    injector: FaultInjector | None = None,
) -> Trainer:
    """Model (with the latent cache when enabled), its DDP or FSDP wrapper
    (``training.strategy``), optimizer and schedule."""
    model = make_model(cfg, infos)
    latents = load_cache(cfg, infos, model) if cfg.cache.enabled else None
    model = model.to(device)
    if cfg.training.compile:
        compile_model(model)
    strategy = make_strategy(cfg.training, model, device, env)
    optimizer = torch.optim.AdamW(  # after wrapping: FSDP replaces the parameters by shards
        [p for p in strategy.model.parameters() if p.requires_grad],
        lr=cfg.training.lr,
        weight_decay=cfg.training.weight_decay,
    )
    return Trainer(
        cfg=cfg,
        env=env,
        device=device,
        strategy=strategy,
        optimizer=optimizer,
        scheduler=lr_schedule(optimizer, cfg, total_steps(cfg, loader.steps_per_epoch)),
        loader=loader,
        injector=injector
        or FaultInjector(
            cfg.faults, env.rank, under_torchrun=env.under_torchrun, stopping=stop.is_set
        ),
        tracker=tracker,
        stop=stop,
        checkpoint_dir=checkpoint_dir,
        state=TrainState(),
        latents=latents,
    )


def params_digest(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 of every parameter's bytes: equal on every rank when the replicas agree."""
    digest = hashlib.sha256()
    for tensor in weights.values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def training_setup(trainer: Trainer) -> dict[str, Any]:
    """How the run trains, for ``train_start`` and the outcome (``training``)."""
    t = trainer.cfg.training
    return {
        "strategy": t.strategy,
        "precision": t.precision,
        "compiled": trainer.compiled,
        "accum_steps": t.accum_steps,
        "oom_policy": t.oom_policy,
    }


def _agree_run_id(cfg: Config, env: DistEnv) -> str:
    chosen = [
        resolve_run_id(cfg.run.output_dir, cfg.run.name, cfg.run.run_id) if env.is_rank0 else None
    ]
    dist.broadcast_object_list(chosen, src=0)
    return str(chosen[0])


def _open_run_dir(cfg: Config, env: DistEnv, run_id: str) -> Path:
    global _fault_log
    run_dir = cfg.run.output_dir / run_id
    log_path = setup_logging(
        rank=env.rank, world_size=env.world_size, run_id=run_id, log_dir=run_dir / "logs"
    )
    assert log_path is not None
    _fault_log = log_path.open("a")
    faulthandler.enable(file=_fault_log, all_threads=True)
    enable_stack_dumps(_fault_log)  # a peer that sees this rank hang asks for its stacks
    publish_whereabouts(env.rank)
    if env.is_rank0:
        _keep_config(run_dir, cfg)
        mark_latest(cfg.run.output_dir, run_dir)
    return run_dir


def _keep_config(run_dir: Path, cfg: Config) -> Path:
    """``config.yaml`` for the first attempt, ``config.attempt-N.yaml`` for each later one:
    a resumed run may differ (allowed changes, a longer ``max_steps``), and each attempt's
    config stays on record."""
    path, n = run_dir / "config.yaml", 1
    while path.exists():
        n += 1
        path = run_dir / f"config.attempt-{n}.yaml"
    atomic_write_text(path, yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def _resume(trainer: Trainer, cfg: Config, env: DistEnv, ckpt_dir: Path) -> dict[str, Any] | None:
    """Rank 0 finds the newest good checkpoint, checks it against this run and sends the
    verdict to every rank; every rank then loads it or raises the same ResumeRefused."""
    facts = run_facts(cfg, env.world_size)
    trainer.checkpoint_extra = lambda: {FACTS_KEY: facts, **rng_state()}
    found: list[Any] = [None]
    if env.is_rank0 and cfg.checkpoint.resume:
        hit = trainer.strategy.latest_good(ckpt_dir)
        other = other_format_checkpoint(ckpt_dir, trainer.strategy.name)
        if hit is None and other is not None:
            found = [strategy_refusal(other, trainer.strategy.name)]
        elif hit is not None:
            try:
                notes = check_resume(
                    hit[1].get(FACTS_KEY),
                    facts,
                    list(cfg.checkpoint.allow_resume_change),
                    str(hit[0]),
                )
                found = [(str(hit[0]), hit[1], notes)]
            except ResumeRefused as exc:
                found = [str(exc)]
    dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return None
    if isinstance(found[0], str):
        raise ResumeRefused(found[0])
    path, state, notes = found[0]
    trainer.strategy.load(Path(path), state, trainer.optimizer)
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.scaler is not None and "scaler" in state:
        trainer.scaler.load_state_dict(state["scaler"])
    trainer.state = TrainState(**state["train_state"])
    torch.set_rng_state(state["rng_cpu"])
    if (warning := restore_rng(state)) is not None:
        log.warning("resume_rng", note=warning)
    saved_step = trainer.state.step
    trainer.state.step = remapped_step(saved_step, state.get(FACTS_KEY), facts)
    if notes:
        log.warning("resume_changes_allowed", changes=notes)
    if trainer.state.step != saved_step:
        log.warning(
            "resume_remapped", saved_step=saved_step, step=trainer.state.step,
            why="global batch changed; same number of samples seen",
        )  # fmt: skip
    log.info("resumed", path=path, step=trainer.state.step, updates=trainer.state.updates)
    return {"step": trainer.state.step, "checkpoint": path, "changes": notes}


def _failure(
    exc: BaseException, cfg: Config, env: DistEnv, step: int | None, run_id: str
) -> Outcome:
    failed_rank: int | None = env.rank
    # First sentence only: gloo appends a paragraph of advice (and an emoji) to its errors.
    text = f"{type(exc).__name__}: {exc}".splitlines()[0].split(". ")[0][:300]
    reason = f"rank {env.rank} failed at step {step}: {text}"
    cause = "exception"
    if isinstance(exc, RunFailed):
        reason, failed_rank, cause = exc.reason, exc.failed_rank, exc.cause
    elif (death := worker_death(str(exc))) is not None:
        reason = f"rank {env.rank} failed at step {step}: its {death.describe()}"
        cause = LOADER_DIED
    elif isinstance(exc, dist.DistError) or "gloo" in text.lower() or "nccl" in text.lower():
        stuck = stuck_ranks(env.world_size, step or 0)
        failed_rank = stuck[0] if stuck else None
        cause = "peer_died"
        if "timed out" in text.lower() or "timeout" in text.lower():
            cause = "hang"
            who = f"rank(s) {stuck} never reached step {step}" if stuck else "a peer did not arrive"
            if stuck:
                log_path = cfg.run.output_dir / run_id / "logs" / f"rank{stuck[0]}.jsonl"
                where = dump_stack_of(stuck[0], log_path)
                who += (
                    f"; rank {stuck[0]} was at {where} (all its threads' stacks are in its log)"
                    if where
                    else f"; rank {stuck[0]}'s stack could not be captured (another host?)"
                )
            reason = (
                f"collective timed out after distributed.collective_timeout_s="
                f"{cfg.distributed.collective_timeout_s:g}s at step {step}: {who} (hung); "
                f"see that rank's log"
            )
        else:
            reason = f"a peer rank died at step {step} (rank {env.rank} saw: {text})"
            told = {r: t for r, t in published_failures(env.world_size).items() if r != env.rank}
            if told:  # the peer said why before it exited (e.g. oom_policy=fail)
                failed_rank, said = min(told.items())
                reason, cause = f"rank {failed_rank} failed at step {step}: {said}", "exception"
    return Outcome(
        run_id=run_id,
        outcome="failed",
        exit_code=exc.exit_code if isinstance(exc, RunFailed) else EXIT_FAILED,
        reason=reason,
        step=step,
        world_size=env.world_size,
        failed_rank=failed_rank,
        cause=cause,
        traceback=str(cfg.run.output_dir / run_id / "logs" / f"rank{failed_rank}.jsonl")
        if failed_rank is not None
        else None,
    )


def _finish(
    outcome: Outcome,
    env: DistEnv,
    run_dir: Path | None,
    tracker: Tracker,
    uploader: Uploader | None = None,
    sync_timeout_s: float = 0.0,
) -> None:
    """The outcome, W&B's end; with a bucket (``uploader``), rank 0 first waits at most
    ``sync_timeout_s`` for the checkpoints, and the outcome says what reached it."""
    if uploader is not None:
        report = flush_checkpoints(uploader, sync_timeout_s)
        outcome = dataclasses.replace(outcome, checkpoint_sync=report.as_dict())
    if env.is_rank0 and run_dir is not None:
        try:
            write_outcome(run_dir, outcome)
        except OSError as exc:  # e.g. the disk that just filled up: the console still says it
            log.error("outcome_not_written", path=str(run_dir / "outcome.json"), error=str(exc))
    tracker.finish(outcome.exit_code)
    if uploader is not None:
        uploader.stop()  # `ups launch` sends the outcome, logs and W&B when it ends
    level = {"finished": "info", "preempted": "warning", "failed": "error"}[outcome.outcome]
    getattr(log, level)(
        "outcome", outcome=outcome.outcome, reason=outcome.reason, exit_code=outcome.exit_code
    )


class _Run:
    """What the run is doing, where it came from and what exists of it so far: every
    outcome, on every way out, is stamped from here."""

    def __init__(self) -> None:
        self.run_id = "unknown"
        self.run_dir: Path | None = None
        self.trainer: Trainer | None = None
        self.resumed_from: dict[str, Any] | None = None
        self.training: dict[str, Any] | None = None
        self.uploader: Uploader | None = None
        """Rank 0 with ``checkpoint_sync.url``: the bucket's uploader."""
        self.enter("init")

    def enter(self, phase: str) -> None:
        self.phase = phase
        log.info("phase", phase=phase)  # ups launch follows these lines for its own outcome

    @property
    def step(self) -> int | None:
        return self.trainer.state.step if self.trainer is not None else None

    def stamp(self, outcome: Outcome) -> Outcome:
        return dataclasses.replace(
            outcome, phase=self.phase, resumed_from=self.resumed_from, training=self.training
        )


def train(cfg: Config, env: DistEnv, infos: dict[str, TaskInfo], *, stop: StopFlag) -> int:
    """Init, build in DDP order, train, evaluate; write the outcome on every way out."""
    tracker = Tracker()
    device = init_distributed(env, cfg.distributed)
    run = _Run()

    def finish(o: Outcome) -> None:
        _finish(run.stamp(o), env, run.run_dir, tracker, run.uploader, final_sync_timeout(cfg, o))

    try:
        trainer = _build(run, cfg, env, infos, device, tracker, stop)
        outcome = _train_and_evaluate(run, trainer, cfg, env, infos, device, tracker, stop)
    except ResumeRefused as exc:
        # A decision every rank took together (rank 0 broadcast it): a config error, no trace.
        outcome = Outcome(
            run_id=run.run_id, outcome="failed", exit_code=EXIT_CONFIG, reason=str(exc),
            world_size=env.world_size, cause="config",
        )  # fmt: skip
    except RunFailed as exc:
        # Agreed by every rank at the same point: a clean exit with its code, no traceback.
        log.error("run_failed", error=exc.reason, exit_code=exc.exit_code)
        outcome = _failure(exc, cfg, env, run.step, run.run_id)
    except BaseException as exc:
        log.error("rank_failed", exc_info=True, error=f"{type(exc).__name__}: {exc}")
        failure = _failure(exc, cfg, env, run.step, run.run_id)
        if failure.cause == "exception" and failure.failed_rank == env.rank:
            publish_failure(env.rank, failure.reason.split(": ", 1)[-1])
        finish(failure)
        raise
    finish(outcome)
    if outcome.outcome != "preempted":  # a preempted worker exits while torchrun stops it
        shutdown_distributed()
    return outcome.exit_code


def _build(
    run: _Run,
    cfg: Config,
    env: DistEnv,
    infos: dict[str, TaskInfo],
    device: torch.device,
    tracker: Tracker,
    stop: StopFlag,
) -> Trainer:
    """Run id, run directory, tracker, loader (after the process group: it shards by rank
    ), trainer, then the resume from the newest good checkpoint."""
    run.run_id = _agree_run_id(cfg, env)
    run.run_dir = _open_run_dir(cfg, env, run.run_id)
    tracker.start(cfg, run_id=run.run_id, run_dir=run.run_dir, rank=env.rank)
    torch.manual_seed(cfg.run.seed)
    injector = FaultInjector(
        cfg.faults, env.rank, under_torchrun=env.under_torchrun, stopping=stop.is_set
    )
    t = cfg.training
    loader = build_loader(
        list(cfg.tasks),
        infos,
        batch_size=t.batch_size * t.accum_steps,  # one optimizer step
        num_workers=t.num_workers,
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.run.seed,
        prefetch_factor=t.prefetch_factor,
        pin_memory=device.type == "cuda" if t.pin_memory == "auto" else t.pin_memory,
        persistent_workers=t.persistent_workers,
        injector=injector,
    )
    checkpoints = run.run_dir / "checkpoints"
    run.trainer = build_trainer(
        cfg, env, infos, device, loader=loader, tracker=tracker, stop=stop,
        checkpoint_dir=checkpoints, injector=injector,
    )  # fmt: skip
    if env.is_rank0 and (uploader := start_sync(cfg, run.run_id, run.run_dir)) is not None:
        run.uploader = uploader  # after fetching a newer checkpoint from the bucket, if any
        run.trainer.after_save = lambda _path: uploader.notify()
    run.resumed_from = _resume(run.trainer, cfg, env, checkpoints)
    if cfg.training.compile:
        run.enter("compile")
        loader.set_epoch(0)
        compile_check(run.trainer, next(iter(loader)))
    run.training = training_setup(run.trainer)
    log.info(
        "train_start",
        steps=run.trainer.total_steps,
        from_step=run.trainer.state.step,
        steps_per_epoch=loader.steps_per_epoch,
        device=str(device),
        **run.training,
    )
    return run.trainer


def _train_and_evaluate(
    run: _Run,
    trainer: Trainer,
    cfg: Config,
    env: DistEnv,
    infos: dict[str, TaskInfo],
    device: torch.device,
    tracker: Tracker,
    stop: StopFlag,
) -> Outcome:
    """Train to the end or the agreed stop, save, and (when finished) evaluate."""
    run.enter("training")
    result = trainer.run()
    trainer.loader.close()  # the workers' memory is not needed for evaluation
    weights = trainer.strategy.weights()  # every rank (FSDP: gathers the full weights)
    log.info("replica_digest", sha256=params_digest(weights), step=trainer.state.step)
    run.enter("final_save")
    # Every rank reached the end (or the stop) and agrees the checkpoint is on disk.
    checkpoint = trainer.checkpoint()
    saved = str(checkpoint) if checkpoint else None
    if result == "preempted":
        return Outcome(
            run_id=run.run_id,
            outcome="preempted",
            exit_code=EXIT_PREEMPTED,
            # state.step counts the steps done: the checkpoint's number, and the table's.
            reason=f"{stop.signal_name or 'SIGTERM'} received; all ranks stopped after step "
            f"{trainer.state.step}; {resume_hint(checkpoint=saved)}",
            step=trainer.state.step,
            world_size=env.world_size,
            signal=stop.signal_name,
            checkpoint=saved,
            cause="preempted",
        )
    run.enter("evaluation")
    # Eager even when compiled: one pass over the test split is not worth a new graph per
    # task and batch shape (compiling them would take longer than the evaluation).
    with torch.compiler.set_stance("force_eager"):
        metrics = evaluate(trainer.strategy.for_eval(), cfg, infos, env, device)
    tracker.summary(metrics)
    log.info("eval", **metrics)
    if (bad := nonfinite_metrics(metrics)) is not None:
        raise bad  # every rank holds the same reduced metrics, so every rank raises
    dist.barrier()
    return Outcome(
        run_id=run.run_id,
        outcome="finished",
        exit_code=EXIT_OK,
        reason=f"all {env.world_size} rank(s) finished {trainer.state.step} steps "
        f"({trainer.state.skipped} skipped)",
        step=trainer.state.step,
        world_size=env.world_size,
        metrics=metrics,
        checkpoint=saved,
    )
