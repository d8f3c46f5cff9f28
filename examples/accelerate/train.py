"""A Hugging Face Accelerate script that keeps the ups checkpoint contract (docs/script.md).

``accelerator.save_state`` writes a checkpoint directory under ``UPS_CHECKPOINT_DIR`` as
``step_N.tmp``, which rank 0 commits (renames to ``step_N``) once every rank has written its
part; ``accelerator.load_state(UPS_RESUME)`` resumes (model, optimizer, RNG and the step,
registered for checkpointing). On SIGTERM every rank agrees to stop after the same step,
saves, and exits 0 (the run ends "preempted"). Deterministic: step N's data depends only on
N and the rank, so a stopped and resumed run ends with the weights of an uninterrupted one.
CPU and gloo here (``Accelerator(cpu=True)``); on GPUs leave ``cpu`` out.

    torchrun --nproc-per-node 2 train.py --steps 10
    ups launch --run-file examples/accelerate/ups-run.yaml
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from accelerate import Accelerator

from ups import ckpt


class Progress:
    """The step reached, saved and restored with the rest of the state."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def save(accelerator: Accelerator, step: int) -> None:
    """Every rank writes its part of ``step_N.tmp``; rank 0 then commits it as ``step_N``."""
    tmp = ckpt.checkpoint_dir() / f"step_{step:06d}.tmp"
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        ckpt.commit(tmp)
    accelerator.wait_for_everyone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--pause-at", type=int, default=-1, help="hold after this step (tests)")
    p.add_argument("--out", default="final.pt", help="rank 0 writes the final weights here")
    args = p.parse_args()

    ckpt.should_stop()  # installs the SIGTERM handler before any work
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    model, opt = accelerator.prepare(net, opt)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if (resume := ckpt.resume_path()) is not None:
        accelerator.load_state(str(resume))
    if accelerator.is_main_process:
        print(f"training steps {progress.step}..{args.steps} resume={resume}", flush=True)
    while progress.step < args.steps:
        step = progress.step + 1
        g = torch.Generator().manual_seed(1000 * step + rank)  # step N's data: N and the rank
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True) * 0.5)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        progress.step = step
        held = time.monotonic()
        while step == args.pause_at and not ckpt.should_stop() and time.monotonic() - held < 120:
            time.sleep(0.1)  # held for a test's SIGTERM, bounded
        # Every rank agrees on stopping at the same step (the signal may reach them apart).
        stop = accelerator.reduce(torch.tensor([1.0 if ckpt.should_stop() else 0.0]), "sum")
        if accelerator.is_main_process:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if stop.item() or step % args.save_every == 0:
            save(accelerator, step)
        if stop.item():
            if accelerator.is_main_process:
                print(f"stopped at step {step}; checkpoint committed", flush=True)
            break
    else:
        if accelerator.is_main_process:
            torch.save(accelerator.unwrap_model(model).state_dict(), os.path.abspath(args.out))
            print(f"finished: weights in {args.out}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
