"""A PyTorch Lightning script that keeps the ups checkpoint contract (docs/script.md).

Lightning's ``ModelCheckpoint(dirpath=UPS_CHECKPOINT_DIR)`` saves every few steps,
``trainer.fit(..., ckpt_path=UPS_RESUME)`` resumes, and a checkpoint IO plugin commits each
file (written as ``*.tmp``, then renamed), so ups never offers a half-written one. On
SIGTERM every rank agrees to stop after the same step, saves, and exits 0 (the run ends
"preempted"). Deterministic: step N's data depends only on N and the rank, so a stopped and
resumed run ends with the weights of an uninterrupted one. CPU and gloo here; on GPUs use
``accelerator="gpu"`` and the nccl backend.

    torchrun --nproc-per-node 2 train.py --steps 10
    ups launch --run-file examples/lightning/ups-run.yaml
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy

from ups import ckpt


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, _batch: Any, _index: int) -> torch.Tensor:
        # The data of step N depends only on N and the rank, not on where a loader stood.
        g = torch.Generator().manual_seed(1000 * (self.global_step + 1) + self.global_rank)
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(self.net(x), x.sum(dim=1, keepdim=True) * 0.5)
        if self.global_rank == 0:
            print(f"step {self.global_step + 1} loss {loss.item():.6f}", flush=True)
        self.log("loss", loss)  # to lightning_logs/ (the run file's `outputs`)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class CommittedCheckpointIO(TorchCheckpointIO):
    """Each checkpoint file is written as ``NAME.tmp``, then committed (renamed to NAME)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        tmp = Path(f"{path}.tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        ckpt.commit(tmp)


class StopOnSigterm(Callback):
    """ups's SIGTERM handler instead of Lightning's (which raises from the loop and ends the
    script non-zero); after each step the ranks agree, and on a stop save and end fit."""

    def __init__(self, pause_at: int) -> None:
        ckpt.should_stop()  # installs the handler
        self.handler = signal.getsignal(signal.SIGTERM)
        self.pause_at = pause_at

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        signal.signal(signal.SIGTERM, self.handler)  # fit installed Lightning's own

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        held = time.monotonic()
        while trainer.global_step == self.pause_at and not ckpt.should_stop():
            if time.monotonic() - held > 120:
                break
            time.sleep(0.1)  # held for a test's SIGTERM, bounded
        if trainer.strategy.reduce_boolean_decision(ckpt.should_stop(), all=False):
            trainer.save_checkpoint(ckpt.checkpoint_dir() / f"step_{trainer.global_step:06d}.ckpt")
            trainer.should_stop = True
            if trainer.global_rank == 0:
                print(f"stopped at step {trainer.global_step}; checkpoint committed", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--pause-at", type=int, default=-1, help="hold after this step (tests)")
    p.add_argument("--out", default="final.pt", help="rank 0 writes the final weights here")
    args = p.parse_args()

    torch.manual_seed(0)
    model = Regressor()
    saver = ModelCheckpoint(
        dirpath=ckpt.checkpoint_dir(),
        filename="step_{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=args.save_every,
        save_top_k=-1,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=DDPStrategy(process_group_backend="gloo"),
        plugins=[CommittedCheckpointIO()],
        callbacks=[StopOnSigterm(args.pause_at), saver],
        max_steps=args.steps,
        max_epochs=-1,
        logger=CSVLogger(".", name="lightning_logs"),  # Lightning's usual lightning_logs/
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    steps = torch.utils.data.DataLoader(
        range(args.steps), batch_size=1
    )  # the data is made in training_step
    resume = ckpt.resume_path()
    if trainer.global_rank == 0:
        print(f"training to step {args.steps} resume={resume}", flush=True)
    trainer.fit(model, steps, ckpt_path=str(resume) if resume else None)
    if trainer.global_rank == 0 and trainer.global_step == args.steps:
        torch.save(model.net.state_dict(), os.path.abspath(args.out))
        print(f"finished: weights in {args.out}", flush=True)


if __name__ == "__main__":
    main()
