"""A plain-DDP script that keeps the ups checkpoint contract (docs/script.md).

Deterministic: the data of step N depends only on N, and a checkpoint holds the model,
the optimizer and the step, so a run stopped and resumed ends with exactly the weights
of an uninterrupted one. Run it bare (``torchrun --nproc-per-node 2 train.py``) or under
ups (``ups launch --run-file examples/ddp/ups-run.yaml``, ``fab deploy --run-file ...``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ups import ckpt


def batch(step: int, rank: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def save(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Rank 0 writes ``step_N.pt.tmp``, then commits it (renamed to ``step_N.pt``)."""
    if ckpt.is_rank0():
        tmp = ckpt.checkpoint_dir() / f"step_{step:06d}.pt.tmp"
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        ckpt.commit(tmp)
    dist.barrier()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--step-s", type=float, default=0.0, help="sleep per step (to stop mid-run)")
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at --fail-at")
    p.add_argument("--fail-at", type=int, default=3)
    p.add_argument(
        "--pause-at", type=int, default=-1, help="hold after this step until stopped (tests)"
    )
    p.add_argument("--out", default="final.pt", help="rank 0 writes the final weights here")
    args = p.parse_args()

    ckpt.should_stop()  # installs the SIGTERM handler before any work
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if (resume := ckpt.resume_path()) is not None:
        state = torch.load(resume, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    if rank == 0:
        print(f"training steps {start}..{args.steps} resume={resume}", flush=True)
    began = time.perf_counter()
    for step in range(start + 1, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_at:
            raise RuntimeError(f"boom on rank {rank} at step {step}")
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_s)
        held = time.monotonic()
        while step == args.pause_at and not ckpt.should_stop() and time.monotonic() - held < 120:
            time.sleep(0.1)  # held for a test's `fab stop`, bounded
        # Every rank agrees on stopping at the same step (the signal may reach them apart).
        stop = torch.tensor([1.0 if ckpt.should_stop() else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if stop.item() or step % args.save_every == 0:
            save(model, opt, step)
        if stop.item():
            if rank == 0:
                print(f"stopped at step {step}; checkpoint committed", flush=True)
            break
    else:
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.abspath(args.out))
            ms = 1000 * (time.perf_counter() - began) / max(1, args.steps - start)
            print(f"finished: weights in {args.out}; {ms:.3f} ms/step", flush=True)
    # Every rank leaves together, and gloo's worker threads get the GIL a moment before the
    # teardown joins them (as ups's trainer does, ups/distributed/process_group.py): seen
    # here without it, a rank aborting at exit ("terminate called without an active
    # exception") after the run's work was done.
    dist.barrier()
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
