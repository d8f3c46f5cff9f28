"""The training loop: local work in a ``try``, then one agreement every rank joins."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
import torch
from torch import Tensor, nn

from ups.config import Config
from ups.distributed.agreement import StepVerdict, agree, average_gradients, heartbeat
from ups.distributed.env import DistEnv
from ups.distributed.lifecycle import set_collective_timeout
from ups.train.checkpoint import save_checkpoint
from ups.train.faults import FaultInjector
from ups.train.metrics import rel_l2
from ups.train.signals import StopFlag
from ups.train.tracking import Tracker

log = structlog.get_logger()
Batch = dict[str, tuple[Tensor, Tensor, Tensor]]


class TooManySkips(RuntimeError):
    """Consecutive steps were skipped for out-of-memory past ``training.max_consecutive_skips``."""


@dataclass(kw_only=True)
class TrainState:
    step: int = 0
    """Batches consumed so far (skipped ones included): the position in the data."""
    updates: int = 0
    """Optimizer updates applied."""
    skipped: int = 0
    """Steps skipped because a rank ran out of memory (no update applied)."""
    consecutive_skips: int = 0
    """Skips in a row; ``training.max_consecutive_skips`` of them fail the run."""

    def as_dict(self) -> dict[str, int]:
        """The counters as stored in a checkpoint (``train_state``)."""
        return asdict(self)


def total_steps(cfg: Config, steps_per_epoch: int) -> int:
    """Steps in the whole run: ``training.max_steps`` or every epoch."""
    return cfg.training.max_steps or cfg.training.epochs * steps_per_epoch


def lr_schedule(
    optimizer: torch.optim.Optimizer, cfg: Config, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` (or constant) over the run."""
    t = cfg.training
    warmup = min(t.warmup_steps, max(total_steps - 1, 0))

    def factor(update: int) -> float:
        if update < warmup:
            return (update + 1) / warmup
        if t.schedule == "constant":
            return 1.0
        progress = min((update - warmup) / max(total_steps - warmup, 1), 1.0)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Trainer:
    """Runs steps until done or told to stop; owns nothing but the loop."""

    def __init__(
        self,
        *,
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        model: nn.parallel.DistributedDataParallel,
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
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.scheduler = scheduler
        self.injector, self.tracker, self.stop = injector, tracker, stop
        self.checkpoint_dir = checkpoint_dir
        self.state = state
        self.latents = latents
        """Cached encoder outputs per task, indexed like the training dataset (cache.enabled)."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.weights = torch.tensor([t.weight for t in cfg.tasks], device=device)
        self.total_steps = total_steps(cfg, loader.steps_per_epoch)
        self.checkpoint_extra: Callable[[], dict[str, Any]] = dict
        """More entries for every checkpoint (``ups.train.resume``: CUDA RNG, run facts)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resumed run needs: model, optimizer, schedule, counters, CPU RNG."""
        return {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "train_state": self.state.as_dict(),
            "rng_cpu": torch.get_rng_state(),
            **self.checkpoint_extra(),
        }

    def save(self) -> Path | None:
        """Rank 0 writes a checkpoint of the current state; other ranks return None."""
        if not self.env.is_rank0:
            return None
        self.injector.before_save(self.state.step)
        path = save_checkpoint(
            self.checkpoint_dir,
            self.state.step,
            self.checkpoint_state(),
            self.cfg.checkpoint.keep_last,
        )
        log.info("checkpoint_saved", path=str(path), step=self.state.step)
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
                    self.save()
        return "finished"

    def train_step(self, batch: Batch, epoch: int) -> StepVerdict:
        """One step on every rank: local forward/backward, then one agreement all ranks
        join (skip on any rank's out-of-memory, stop on a signal), then the update.

        Returns the agreed verdict; ``state.step`` has advanced either way.
        """
        step, started = self.state.step, time.perf_counter()
        structlog.contextvars.bind_contextvars(step=step)
        oom_reason = None
        losses: Tensor | None = None
        if self.cfg.training.record_sample_ids:
            log.debug("batch_ids", ids={t: idx.tolist() for t, (_, _, idx) in batch.items()})
        try:
            self.injector.fire(step)
            losses = self._forward_backward(batch)
        except torch.OutOfMemoryError as exc:
            # Local clean-up only: the other ranks learn about it at the agreement below.
            oom_reason = str(exc).splitlines()[0]
            losses = None
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        heartbeat(self.env.rank, step)
        verdict = agree(
            oom=oom_reason is not None,
            stop=self.stop.is_set(),
            rank=self.env.rank,
            world_size=self.env.world_size,
            device=self.device,
        )
        if verdict.skip:
            self._skip(verdict, oom_reason)
        else:
            assert losses is not None  # nobody ran out of memory, so every rank has losses
            mean_losses = average_gradients(self.params, losses.detach(), self.env.world_size)
            if self.cfg.training.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.params, self.cfg.training.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.updates += 1
            self.state.consecutive_skips = 0
            self._log_progress(batch, mean_losses, epoch, time.perf_counter() - started)
        if step == 0:
            set_collective_timeout(self.cfg.distributed.collective_timeout_s)
        self.state.step += 1
        return verdict

    def _forward_backward(self, batch: Batch) -> Tensor:
        inputs = {task: x.to(self.device) for task, (x, _, _) in batch.items()}
        latents = None
        if self.latents is not None:
            latents = {t: self.latents[t][idx].to(self.device) for t, (_, _, idx) in batch.items()}
        # no_sync: gradients stay local until every rank has agreed the step is good.
        with self.model.no_sync():
            preds = self.model(inputs, latents)
            losses = torch.stack(
                [rel_l2(preds[t], batch[t][1].to(self.device)).mean() for t in batch]
            )
            loss = (self.weights * losses).sum() / self.weights.sum()
            loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        return losses

    def _skip(self, verdict: StepVerdict, reason: str | None) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.state.skipped += 1
        self.state.consecutive_skips += 1
        log.warning(
            "step_skipped",
            oom_ranks=list(verdict.oom_ranks),
            reason=reason or f"out of memory on rank(s) {list(verdict.oom_ranks)}",
            consecutive=self.state.consecutive_skips,
        )
        if self.state.consecutive_skips >= self.cfg.training.max_consecutive_skips:
            raise TooManySkips(
                f"{self.state.consecutive_skips} consecutive steps skipped for out-of-memory on "
                f"rank(s) {list(verdict.oom_ranks)} (limit training.max_consecutive_skips="
                f"{self.cfg.training.max_consecutive_skips}); lower training.batch_size or the "
                "model size"
            )

    def _log_progress(self, batch: Batch, losses: Tensor, epoch: int, seconds: float) -> None:
        step = self.state.step
        if step % self.cfg.training.log_every and step != self.total_steps - 1:
            return
        per_task = dict(zip(batch, losses.tolist(), strict=True))
        samples = sum(len(x) for x, _, _ in batch.values()) * self.env.world_size
        metrics = {
            "train/loss": float((self.weights * losses).sum() / self.weights.sum()),
            **{f"train/{task}/rel_l2": value for task, value in per_task.items()},
            "train/samples_per_s": samples / seconds,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/epoch": float(epoch),
        }
        if self.env.is_rank0:
            log.info("train_step", epoch=epoch, updates=self.state.updates, **metrics)
        self.tracker.log(metrics, step=step)
