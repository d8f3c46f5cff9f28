"""One rank of the all-reduce check: ``python -m ups.preflight.allreduce_worker ...``.

Joins a fresh process group (bounded by ``--timeout-s``), all-reduces a known pattern and
counts wrong elements, then times a size sweep. Rank 0 prints one JSON line on stdout.
Times are the slowest rank's (all-reduced with MAX), like a collective is as slow as its
slowest member.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import sys
import time

from ups import jsonio


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ups.preflight.allreduce_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--init-method", required=True, help="tcp://HOST:PORT")
    p.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=30.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", args.rank)
        torch.cuda.set_device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.init_process_group(
        backend=args.backend,
        init_method=args.init_method,
        rank=args.rank,
        world_size=args.world_size,
        timeout=dt.timedelta(seconds=args.timeout_s),
    )
    n = args.world_size
    numel = 1 << 18
    pattern = torch.arange(numel, device=device) % 13
    t = pattern.float() + args.rank
    dist.all_reduce(t)
    # Small integers are exact in float32, so any difference is a real error.
    expected = pattern.float() * n + n * (n - 1) / 2
    wrong = torch.tensor([int((t != expected).sum().item())], device=device)
    dist.all_reduce(wrong)

    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        nbytes = buf.numel() * 4
        algbw = nbytes / seconds / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_s": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (n - 1) / n,
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    if args.rank == 0:
        print(jsonio.dumps({"wrong": int(wrong.item()), "sizes": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
