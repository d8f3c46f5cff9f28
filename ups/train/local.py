"""The rank-local part of a step: forward and backward of every micro-batch, then this
rank's NaN/inf flag. Nothing here talks to another rank, except DDP's own all-reduce in
the last backward under ``oom_policy: fail`` (``sync``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ups.config import Config
from ups.train.accum import Batch, micro_batches
from ups.train.amp import autocast
from ups.train.faults import FaultInjector
from ups.train.metrics import rel_l2
from ups.train.strategy import Grads, Strategy


class LocalStep:
    """Forward/backward of a step batch in micro-batches of ``training.batch_size``."""

    def __init__(
        self,
        *,
        cfg: Config,
        device: torch.device,
        strategy: Strategy,
        injector: FaultInjector,
        scaler: torch.amp.GradScaler | None,
        params: Sequence[Tensor],
        grads: Grads | None,
        latents: dict[str, Tensor] | None,
    ) -> None:
        self.cfg, self.device, self.injector = cfg, device, injector
        self.strategy, self.model = strategy, strategy.model
        self.scaler, self.params, self.grads = scaler, list(params), grads
        self.latents = latents
        """Cached encoder outputs per task, indexed like the training dataset (cache.enabled)."""
        self.tasks = [t.name for t in cfg.tasks]
        self.weights = torch.tensor([t.weight for t in cfg.tasks], device=device)

    def run(self, batch: Batch, step: int, *, sync: bool) -> Tensor:
        """Forward and backward of every micro-batch; the gradients add up in ``.grad``.

        Every micro-batch runs with gradients kept local (DDP's ``no_sync``; FSDP's sync is
        off for good) until the ranks agree, except the last when ``sync``: then DDP
        all-reduces during its backward (``oom_policy: fail``, DDP only).
        Returns this rank's per-task mean losses over the whole step batch (detached).
        """
        self.injector.fire(step, "forward")
        total = torch.zeros(len(self.tasks), device=self.device)
        micros = micro_batches(batch, self.cfg.training.batch_size)
        for k, micro in enumerate(micros):
            last = k == len(micros) - 1
            with contextlib.nullcontext() if sync and last else self.strategy.local_backward():
                total += self._micro_step(micro.batch, micro.shares, step)
        return total

    def _micro_step(self, batch: Batch, shares: dict[str, float], step: int) -> Tensor:
        index = [self.tasks.index(t) for t in batch]
        inputs = {task: x.to(self.device) for task, (x, _, _) in batch.items()}
        latents = None
        if self.latents is not None:
            latents = {t: self.latents[t][idx].to(self.device) for t, (_, _, idx) in batch.items()}
        with autocast(self.cfg.training.precision, self.device):
            preds = self.model(inputs, latents)
        # The loss in fp32 whatever the forward's precision; each task's micro-batch mean is
        # weighted by its share of the step's samples, so the sum is the step batch's mean.
        losses = torch.stack(
            [
                shares[t] * rel_l2(preds[t].float(), batch[t][1].to(self.device)).mean()
                for t in batch
            ]
        )
        losses = self.injector.corrupt(step, losses)
        loss = (self.weights[index] * losses).sum() / self.weights.sum()
        self.injector.fire(step, "backward")
        backward = loss if self.scaler is None else self.scaler.scale(loss)
        backward.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        out = torch.zeros(len(self.tasks), device=self.device)
        out[index] = losses.detach()
        return out

    def nonfinite(self, losses: Tensor) -> Tensor:
        """This rank's NaN/inf flag (a device tensor: the agreement reads it): its loss, and
        its local gradients (``skip``) or the averaged ones DDP left (``fail``)."""
        bad_loss = ~torch.isfinite(losses).all()
        if self.grads is not None:
            return bad_loss | self.grads.nonfinite()
        grads = [p.grad for p in self.params if p.grad is not None]
        # The max-norm is NaN/inf exactly when some element is, and cannot overflow.
        return bad_loss | ~torch.isfinite(nn.utils.get_total_norm(grads, norm_type=math.inf))
