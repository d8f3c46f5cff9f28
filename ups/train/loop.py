"""The training loop: each step's fallible work sits before one of two agreements.

A step, on every rank, on every path (``training.oom_policy: skip``, the default)::

    forward, backward of each micro-batch  (guarded: OOM -> a flag; NaN/inf -> a flag)
    heartbeat; agree_local              (OOM, non-finite, rank 0's failed save, SIGTERM),
                                        in the same all_reduce as the gradient sum (DDP)
    -- only if every rank is clean --
    average the summed gradients (in place, in the flat buffer the gradients live in)
    clip, optimizer, scheduler          (guarded: OOM -> a status)
    agree_update                       (DONE / OOM before the optimizer / OOM inside it)

With ``accum_steps: N`` the first line runs N times under ``no_sync`` and the rest once:
one agreement covers every micro-batch, and a skipped step skips all N.

With ``oom_policy: fail`` the backward of the last micro-batch runs with DDP's own bucketed
all-reduce, overlapped with the backward, so there is no status exchange before the
gradients travel and an out-of-memory error ends the run instead (the rank exits; the
others fail at that collective within ``distributed.collective_timeout_s``, or at once
when its connections close). The one agreement left runs after the backward (non-finite,
failed save, SIGTERM); an OOM in the update also ends the run, so there is no second one.

Why two points and pre-allocation rather than one point: the gradients can be used only
once the first agreement says every rank has good ones (a rank that failed sends zeros or
garbage, so under DDP the status rows ride in the gradient all-reduce and the sum is
cleared unread when a rank failed; FSDP all-reduces after the agreement), and the update
needs the all-reduce's result, so an OOM in the update can only be agreed at a second
point. What can be allocated once is allocated at start so it cannot fail later: the
flat gradient buffer (``GradBuffer``) and AdamW's state (``materialize_optimizer_state``).
After a partial OOM inside the optimizer step a replica is in an unknown state; it is
repaired by copying a rank whose update completed (in place: no memory needed), since
undoing the update would need a second copy of the optimizer state.

Under ``training.strategy: fsdp`` (``ups.train.strategy``) the step has the same two
points; the strategy adds one all-gather of the parameters at the start of every step,
before any fallible work (``ups.distributed.fsdp``), and the all-reduce feeds each
rank's shard.

Non-finite averaged gradients need no check of their own: every rank's local gradients
were checked before the all-reduce, and the average of finite values is finite (an
overflowing norm makes ``clip_grad_norm_`` scale by zero, never by NaN).

Host syncs per step: each agreement reads its table on the host (the branch that follows
needs it), so ``skip`` has two and ``fail`` one; the losses logged every ``log_every``
steps come from the first table, so logging adds none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import structlog
import torch
import torch.distributed as dist
from torch import Tensor

from ups.config import Config
from ups.distributed.agreement import (
    LocalVerdict,
    Update,
    agree_local,
    agree_update,
    exchange,
    heartbeat,
    status_length,
)
from ups.distributed.env import DistEnv
from ups.distributed.process_group import set_collective_timeout
from ups.outcome import EXIT_FAILED, EXIT_SAVE_FAILED
from ups.train.amp import is_overflow, make_scaler, scaler_forget_step, scaler_overflow
from ups.train.checkpoint import CheckpointSaveFailed
from ups.train.failures import RunFailed, TooManySkips, nonfinite_failure
from ups.train.faults import FaultInjector
from ups.train.local import LocalStep
from ups.train.schedule import TrainState, materialize_optimizer_state, total_steps
from ups.train.signals import StopFlag
from ups.train.strategy import Grads, Strategy
from ups.train.tracking import Tracker

log = structlog.get_logger()
Batch = dict[str, tuple[Tensor, Tensor, Tensor]]


class OutOfMemoryFail(RuntimeError):
    """Out of memory under ``training.oom_policy: fail``: this rank exits with this error."""


class Trainer:
    """Runs steps until done or told to stop; owns nothing but the loop."""

    def __init__(
        self,
        *,
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        strategy: Strategy,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        loader: Any,
        injector: FaultInjector,
        tracker: Tracker,
        stop: StopFlag,
        checkpoint_dir: Path,
        state: TrainState,
        latents: dict[str, Tensor] | None = None,
    ) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.strategy, self.model = strategy, strategy.model
        self.optimizer, self.loader = optimizer, loader
        self.scheduler = scheduler
        self.injector, self.tracker, self.stop = injector, tracker, stop
        self.checkpoint_dir = checkpoint_dir
        self.state = state
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.tasks = [t.name for t in cfg.tasks]
        self.total_steps = total_steps(cfg, loader.steps_per_epoch)
        self.checkpoint_extra: Callable[[], dict[str, Any]] = dict
        """More entries for every checkpoint (``ups.train.resume``: CUDA RNG, run facts)."""
        self.after_save: Callable[[Path], None] = lambda path: None
        """Rank 0, after each checkpoint is committed (``checkpoint_sync``'s uploader)."""
        self.fail_on_oom = cfg.training.oom_policy == "fail"
        """DDP all-reduces during the backward; an OOM ends the run (no agreement first)."""
        self.scaler = make_scaler(cfg.training.precision, device)
        self.compiled = False
        """``torch.compile`` ran (set by ``ups.train.compile.compile_check``)."""
        materialize_optimizer_state(optimizer)
        table = env.world_size * status_length(len(self.tasks))
        self.grads = None if self.fail_on_oom else strategy.grad_buffer(self.params, table)
        """``oom_policy: skip``: the gradients' own buffer; under ``fail`` DDP's buckets are."""
        self.local = LocalStep(cfg=cfg, device=device, strategy=strategy, injector=injector,
                               scaler=self.scaler, params=self.params, grads=self.grads,
                               latents=latents)  # fmt: skip
        self.save_error: CheckpointSaveFailed | None = None
        """Rank 0's last failed save, reported at the next agreement."""
        self._tight_timeout = False
        """The collective timeout is tightened after this attempt's first step."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resumed run needs: model, optimizer, schedule, counters, CPU RNG."""
        return {
            **self.strategy.model_state(self.optimizer),  # "model", "optimizer"
            "scheduler": self.scheduler.state_dict(),
            "train_state": self.state.as_dict(),
            "rng_cpu": torch.get_rng_state(),
            **({"scaler": self.scaler.state_dict()} if self.scaler is not None else {}),
            **self.checkpoint_extra(),
        }

    def save(self) -> Path | None:
        """Rank 0 writes a checkpoint of the current state (every rank under FSDP: each
        writes its shard); other ranks return None.

        A failed write is kept in ``save_error`` (not raised): the other ranks learn of it
        at the next agreement, and every rank stops there together.
        """
        if not self.strategy.saves_on(self.env.rank):
            return None
        self.injector.before_save(self.state.step)
        try:
            path = self.strategy.save(
                self.checkpoint_dir,
                self.state.step,
                self.checkpoint_state(),
                self.cfg.checkpoint.keep_last,
            )
        except CheckpointSaveFailed as exc:
            self.save_error = exc
            log.error(
                "checkpoint_save_failed",
                path=str(exc.path),
                needed=exc.needed,
                free=exc.free,
                error=str(exc.cause),
            )
            return None
        log.info("checkpoint_saved", path=str(path), step=self.state.step)
        if self.env.is_rank0:  # rank 0 commits a sharded checkpoint too
            self.after_save(path)
        return path

    def checkpoint(self) -> Path | None:
        """Every rank: rank 0 saves, then all agree that the save worked (or stop together).

        The other ranks wait in that agreement while rank 0 writes, so it runs under the
        save window (``max(collective_timeout_s, stop_grace_s)``), not the tight per-step
        timeout: a large checkpoint on a slow disk is not a hang. Used for the periodic
        saves and the final (finished or preempted) one alike.
        """
        structlog.contextvars.bind_contextvars(step=self.state.step)
        dist_cfg = self.cfg.distributed
        set_collective_timeout(max(dist_cfg.collective_timeout_s, dist_cfg.stop_grace_s))
        path = self.save()
        verdict = self._agree(oom=False, nonfinite=False, losses=None)
        if self._tight_timeout:
            set_collective_timeout(dist_cfg.collective_timeout_s)
        if verdict.save_failed:
            raise self._save_failure()
        return path

    def run(self) -> Literal["finished", "preempted"]:
        """Train from ``state.step`` to ``total_steps``, checkpointing every
        ``checkpoint.every_steps``; "preempted" as soon as the ranks agree to stop.

        Raises whatever a step raises (a rank's error, :class:`TooManySkips`); the caller
        writes the outcome.
        """
        spe = self.loader.steps_per_epoch
        while self.state.step < self.total_steps:
            epoch, offset = divmod(self.state.step, spe)
            self.loader.set_epoch(epoch, start_step=offset)
            for batch in self.loader:
                verdict = self.train_step(batch, epoch)
                if verdict.stop:
                    log.warning("preempt_stop", step=self.state.step, signal=self.stop.signal_name)
                    return "preempted"
                if self.state.step >= self.total_steps:
                    break
                if self.state.step % self.cfg.checkpoint.every_steps == 0:
                    self.checkpoint()
        return "finished"

    def train_step(self, batch: Batch, epoch: int) -> LocalVerdict:
        """One optimizer step on every rank: local forward/backward of every micro-batch,
        then the agreements every rank joins (skip or stop on any rank's out-of-memory,
        non-finite loss, failed save or signal), then the update.

        Returns the agreed verdict; ``state.step`` has advanced either way.
        """
        step, started = self.state.step, time.perf_counter()
        structlog.contextvars.bind_contextvars(step=step)
        oom_reason = None
        losses: Tensor | None = None
        nonfinite: Tensor | bool = False
        if self.cfg.training.record_sample_ids:
            log.debug("batch_ids", ids={t: idx.tolist() for t, (_, _, idx) in batch.items()})
        self.strategy.begin_step()  # FSDP's all-gather: a collective, so before any fault point
        if self.grads is not None:
            self.grads.attach()
        try:
            self.injector.fire(step)
            if self.fail_on_oom:  # the step's first collective is DDP's, inside the backward
                heartbeat(self.env.rank, step)
            losses = self.forward_backward(batch, step, sync=self.fail_on_oom)
            self.injector.fire(step, "pack")
            nonfinite = self.local.nonfinite(losses)
        except torch.OutOfMemoryError as exc:
            if self.fail_on_oom:
                raise self._oom_fail(exc) from exc
            # Local clean-up only: the other ranks learn about it at the agreement below.
            oom_reason = str(exc).splitlines()[0]
            losses, nonfinite = None, False
            self._free_memory()
        if not self.fail_on_oom:
            heartbeat(self.env.rank, step)
        verdict = self._agree(
            oom=oom_reason is not None, nonfinite=nonfinite, losses=losses, grads=self.grads
        )
        if verdict.save_failed:
            raise self._save_failure()
        overflow = not verdict.oom_ranks and is_overflow(
            self.scaler, verdict.nonfinite_ranks, verdict.losses
        )
        if verdict.nonfinite_ranks and not overflow and self.cfg.training.nonfinite == "fail":
            raise nonfinite_failure(
                step,
                verdict.nonfinite_ranks,
                verdict.losses,
                self.tasks,
                lr=self.cfg.training.lr,
                grad_clip=self.cfg.training.grad_clip,
            )
        if verdict.clean:
            if self.grads is not None:
                self.grads.average(self.env.world_size)
            self._apply_update(batch, epoch, started, verdict)
        elif overflow:
            self._overflow_skip(verdict)
        else:
            self._skip(verdict, oom_reason)
        self._zero_grads()
        if not self._tight_timeout:
            # The first step of every attempt (fresh or resumed) may be slow; later ones not.
            set_collective_timeout(self.cfg.distributed.collective_timeout_s)
            self._tight_timeout = True
        self.state.step += 1
        return verdict

    def _agree(
        self,
        *,
        oom: bool,
        nonfinite: Tensor | bool,
        losses: Tensor | None,
        grads: Grads | None = None,
    ) -> LocalVerdict:
        """Point 1; with ``grads``, in their collective (the step's), else on its own."""
        return agree_local(
            exchange_rows=exchange if grads is None else grads.exchange,
            oom=oom,
            nonfinite=nonfinite,
            losses=losses,
            n_tasks=len(self.tasks),
            save_failed=self.save_error is not None,
            stop=self.stop.is_set(),
            rank=self.env.rank,
            world_size=self.env.world_size,
            device=self.device,
        )

    def forward_backward(self, batch: Batch, step: int, *, sync: bool) -> Tensor:
        """The local work of a step (``ups.train.local``): this rank's per-task losses."""
        return self.local.run(batch, step, sync=sync)

    def _update(self, step: int) -> Update:
        """Clip, optimizer and scheduler step; an OOM becomes a status, not a raise (under
        ``oom_policy: fail`` it ends the run)."""
        in_step = False
        try:
            self.injector.fire(step, "clip")
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            if self.cfg.training.grad_clip > 0:
                self.strategy.clip(self.params, self.cfg.training.grad_clip)
            in_step = True
            self.injector.fire(step, "optimizer")
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # the agreement found no overflow: it steps
                self.scaler.update()
            else:
                self.optimizer.step()
            self.injector.fire(step, "scheduler")
            self.scheduler.step()
        except torch.OutOfMemoryError as exc:
            if self.fail_on_oom:
                raise self._oom_fail(exc) from exc
            log.warning("update_oom", error=str(exc).splitlines()[0], in_optimizer=in_step)
            self._free_memory()
            return Update.OOM_IN_STEP if in_step else Update.OOM_BEFORE_STEP
        return Update.DONE

    def _apply_update(self, batch: Batch, epoch: int, started: float, local: LocalVerdict) -> None:
        status = self._update(self.state.step)
        ranks = range(self.env.world_size)
        mean_losses = [
            math.fsum(local.losses[r][i] for r in ranks) / len(ranks)
            for i in range(len(self.tasks))
        ]
        if self.fail_on_oom:  # an OOM in the update raised: every rank that got here is DONE
            self._count_update(batch, mean_losses, epoch, started)
            return
        verdict = agree_update(
            status, rank=self.env.rank, world_size=self.env.world_size, device=self.device
        )
        if verdict.applied:
            self._count_update(batch, mean_losses, epoch, started)
            return
        oom_ranks = verdict.ranks(Update.OOM_BEFORE_STEP, Update.OOM_IN_STEP)
        source = verdict.source
        if source is not None:
            self.strategy.repair(self.params, self.optimizer, source, self.state.step)
            self._sync_scheduler(source)
            self.state.updates += 1
            self.state.consecutive_skips = 0
            log.warning("update_repaired", oom_ranks=oom_ranks, source_rank=source)
            return
        if verdict.ranks(Update.OOM_IN_STEP):
            raise RunFailed(
                f"out of memory inside the optimizer step on every rank at step "
                f"{self.state.step}: the replicas are partly updated and cannot be trusted. "
                "Lower training.batch_size or the model size, then start again (with "
                "--allow-resume-change to keep the last checkpoint)",
                exit_code=EXIT_FAILED,
                cause="oom_in_step",
                failed_rank=oom_ranks[0],
            )
        self._count_skip(
            f"out of memory before the optimizer step on rank(s) {oom_ranks}",
            oom_ranks=oom_ranks,
            nonfinite_ranks=[],
        )

    def _count_update(self, batch: Batch, losses: list[float], epoch: int, started: float) -> None:
        self.state.updates += 1
        self.state.consecutive_skips = 0
        self._log_progress(batch, losses, epoch, time.perf_counter() - started)

    def _oom_fail(self, exc: torch.OutOfMemoryError) -> OutOfMemoryFail:
        return OutOfMemoryFail(
            f"out of memory on rank {self.env.rank} at step {self.state.step} with "
            "training.oom_policy=fail; lower training.batch_size (raise accum_steps to keep "
            f"the step's samples) or set oom_policy=skip ({str(exc).splitlines()[0][:80]})"
        )

    def _overflow_skip(self, verdict: LocalVerdict) -> None:
        """fp16 gradients overflowed on some rank: every rank backs the loss scale off."""
        assert self.scaler is not None  # is_overflow is only true with a scaler
        grads = [p.grad for p in self.params if p.grad is not None]
        scale = scaler_overflow(self.scaler, self.optimizer, grads)
        if scale < 1.0:  # overflow even unscaled: a divergence, counted like any other skip
            self._skip(verdict, None)
            return
        # Above 1 it is the scaler finding its range: not counted against the skip limit.
        self.state.skipped += 1
        log.info(
            "step_skipped",
            oom_ranks=[],
            nonfinite_ranks=list(verdict.nonfinite_ranks),
            reason=f"fp16 gradient overflow; loss scale now {scale:g}",
            consecutive=self.state.consecutive_skips,
        )

    def _sync_scheduler(self, source: int) -> None:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        state: list[Any] = [self.scheduler.state_dict(), scaler]
        dist.broadcast_object_list(state, src=source)
        self.scheduler.load_state_dict(state[0])
        if self.scaler is not None:
            self.scaler.load_state_dict(state[1])
        for group, lr in zip(
            self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
        ):
            group["lr"] = lr

    def _zero_grads(self) -> None:
        """Clear the gradients in place: they stay views of the buffer the all-reduce runs
        in (ours under ``skip``, DDP's buckets under ``fail``), so nothing is reallocated."""
        if self.grads is not None:
            self.grads.zero()
        else:
            self.optimizer.zero_grad(set_to_none=False)

    def _free_memory(self) -> None:
        self._zero_grads()
        scaler_forget_step(self.scaler)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _cuda_memory(self) -> dict[str, int]:
        """What this rank's GPU holds after a skip: shows whether the skipped step's memory
        went back (allocated) and whether the allocator returned it to the device (reserved)."""
        if self.device.type != "cuda":
            return {}
        return {
            "cuda_allocated_bytes": torch.cuda.memory_allocated(self.device),
            "cuda_reserved_bytes": torch.cuda.memory_reserved(self.device),
        }

    def _save_failure(self) -> RunFailed:
        if self.save_error is not None:
            return RunFailed(
                self.save_error.reason(),
                exit_code=EXIT_SAVE_FAILED,
                cause="save_failed",
                failed_rank=0,
            )
        return RunFailed(
            "rank 0 could not write a checkpoint (its log and outcome.json say why)",
            exit_code=EXIT_SAVE_FAILED,
            cause="save_failed",
            failed_rank=0,
        )

    def _skip(self, verdict: LocalVerdict, reason: str | None) -> None:
        causes = []
        if verdict.oom_ranks:
            causes.append(reason or f"out of memory on rank(s) {list(verdict.oom_ranks)}")
        if verdict.nonfinite_ranks:
            causes.append(f"non-finite loss or gradient on rank(s) {list(verdict.nonfinite_ranks)}")
        self._count_skip(
            "; ".join(causes),
            oom_ranks=list(verdict.oom_ranks),
            nonfinite_ranks=list(verdict.nonfinite_ranks),
        )

    def _count_skip(self, reason: str, *, oom_ranks: list[int], nonfinite_ranks: list[int]) -> None:
        self.state.skipped += 1
        self.state.consecutive_skips += 1
        log.warning(
            "step_skipped",
            oom_ranks=oom_ranks,
            nonfinite_ranks=nonfinite_ranks,
            reason=reason,
            consecutive=self.state.consecutive_skips,
            **self._cuda_memory(),
        )
        if self.state.consecutive_skips >= self.cfg.training.max_consecutive_skips:
            what = "out-of-memory" if oom_ranks else "non-finite loss or gradient"
            fix = (
                "lower training.batch_size or the model size"
                if oom_ranks
                else "lower training.lr and set training.grad_clip"
            )
            raise TooManySkips(
                f"{self.state.consecutive_skips} consecutive steps skipped for {what} on "
                f"rank(s) {oom_ranks or nonfinite_ranks} (limit training.max_consecutive_skips="
                f"{self.cfg.training.max_consecutive_skips}); {fix}"
            )

    def _log_progress(self, batch: Batch, losses: list[float], epoch: int, seconds: float) -> None:
        step = self.state.step
        if step % self.cfg.training.log_every and step != self.total_steps - 1:
            return
        per_task = dict(zip(self.tasks, losses, strict=True))
        # The whole step batch: accum_steps micro-batches on every rank.
        samples = sum(len(x) for x, _, _ in batch.values()) * self.env.world_size
        weights = [t.weight for t in self.cfg.tasks]
        metrics = {
            "train/loss": math.fsum(w * v for w, v in zip(weights, losses, strict=True))
            / math.fsum(weights),
            **{f"train/{task}/rel_l2": value for task, value in per_task.items()},
            "train/samples_per_s": samples / seconds,
            "train/lr": float(self.scheduler.get_last_lr()[0]),
            "train/epoch": float(epoch),
        }
        if self.env.is_rank0:
            log.info("train_step", epoch=epoch, updates=self.state.updates, **metrics)
        self.tracker.log(metrics, step=step)
