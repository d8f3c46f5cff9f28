"""All-reduce: correctness and bus bandwidth across fresh processes, nccl-tests style.

One process per GPU with nccl; on a host without GPUs, gloo with CPU processes so the
check (and the process-group plumbing under it) is exercised everywhere. Every worker
runs under one outer deadline: a peer that never joins, hangs or dies fails the check
in bounded time and the remaining workers are killed.

nccl workers are fresh interpreters (CUDA cannot be used in a forked child); gloo workers
are forked from this process, which has torch imported already: a fresh interpreter
would spend a second or more importing torch before its first collective.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ups.preflight.checks.ports import pick_free_port
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status
from ups.preflight.thresholds import floor_gbps

CPU_SIZES = (256 * 1024, 1 << 20, 4 << 20, 16 << 20)
GPU_SIZES = (1 << 20, 16 << 20, 128 << 20, 512 << 20)
_POLL_S = 0.05
_SCRUB_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AllReducePlan:
    """What will run; printable and inspectable before anything starts."""

    backend: str
    world_size: int
    port: int
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    timeout_s: float
    """Outer deadline for all workers together, and each worker's process-group timeout."""
    gpu_name: str | None = None

    def command(self, rank: int) -> list[str]:
        """A fresh interpreter running ``rank``."""
        return [sys.executable, "-m", "ups.preflight.allreduce_worker", *self.worker_args(rank)]

    def worker_args(self, rank: int) -> list[str]:
        """``rank``'s arguments to :func:`ups.preflight.allreduce_worker.main`."""
        return [
            "--rank",
            str(rank),
            "--world-size",
            str(self.world_size),
            "--init-method",
            f"tcp://127.0.0.1:{self.port}",
            "--backend",
            self.backend,
            "--sizes",
            ",".join(map(str, self.sizes)),
            "--iters",
            str(self.iters),
            "--warmup",
            str(self.warmup),
            "--timeout-s",
            str(self.timeout_s),
        ]


@dataclass(kw_only=True, slots=True)
class AllReduceRun:
    """What happened: rank 0's measurements, or why there are none."""

    ok: bool
    elapsed_s: float
    wrong: int | None = None
    sizes: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    """Per rank; None for a rank killed at the deadline."""
    stderr_tail: dict[int, str] = field(default_factory=dict)


def plan_for(ctx: Context, timeout_s: float) -> AllReducePlan:
    """nccl over the visible GPUs, or gloo over ``cpu_procs`` CPU processes."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    port = pick_free_port(0, "127.0.0.1")
    if gpus and ctx.backend != "gloo":
        world = min(ctx.nproc_per_node or gpus, gpus)
        return AllReducePlan(
            backend="nccl",
            world_size=world,
            port=port,
            sizes=GPU_SIZES,
            iters=20,
            warmup=5,
            timeout_s=timeout_s,
            gpu_name=torch.cuda.get_device_name(0),
        )
    return AllReducePlan(
        backend="gloo",
        world_size=ctx.opts.cpu_procs,
        port=port,
        sizes=CPU_SIZES,
        iters=5,
        warmup=2,
        timeout_s=timeout_s,
    )


def can_fork(plan: AllReducePlan) -> bool:
    """Whether ``plan``'s workers may be forked from this process.

    Only gloo on CPU tensors, and only while this process holds no CUDA context and no
    process group: a forked child can use neither, and would inherit the group.
    """
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # unannotated
    in_group = dist.is_available() and dist.is_initialized()
    return plan.backend == "gloo" and not cuda and not in_group


class _ForkedRank:
    """A worker forked from this process, with the part of Popen's interface execute uses."""

    def __init__(self, args: list[str], out: Path, err: Path) -> None:
        # Imported here so that every forked child finds them loaded.
        import torch.distributed  # noqa: F401

        import ups.preflight.allreduce_worker  # noqa: F401

        context = multiprocessing.get_context("fork")
        self._proc = context.Process(target=_forked_main, args=(args, out, err), daemon=True)
        self._proc.start()

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def kill(self) -> None:
        self._proc.kill()

    def wait(self) -> int | None:
        self._proc.join()
        return self._proc.exitcode


def _forked_main(args: list[str], out: Path, err: Path) -> None:
    """A forked worker: what a fresh one would have (own output files, default signal
    handling, one thread, no torchrun variables), then the worker's own ``main``."""
    import torch

    from ups.preflight import allreduce_worker

    for signum in (signal.SIGINT, signal.SIGTERM):  # not the parent's handlers
        signal.signal(signum, signal.SIG_DFL)
    # New file objects: another thread of the parent may have held the inherited
    # sys.stdout's lock at the fork. fd 2 too, for faulthandler and gloo's own messages.
    sys.stdout = out.open("w")  # process-long, flushed at exit
    sys.stderr = err.open("w", buffering=1)
    os.dup2(sys.stderr.fileno(), 2)
    for key in _SCRUB_ENV:
        os.environ.pop(key, None)
    # As OMP_NUM_THREADS=1 does for a fresh worker; the parent's OpenMP pool is not
    # usable in a forked child, one thread never touches it.
    torch.set_num_threads(1)
    sys.exit(allreduce_worker.main(args))


def execute(plan: AllReducePlan, ranks: list[int] | None = None) -> AllReduceRun:
    """Start the workers (``ranks``: a subset, to simulate a peer that never joins) and wait.

    Fails fast when any worker exits non-zero; kills every worker still running at the
    deadline.
    """
    ranks = list(range(plan.world_size)) if ranks is None else ranks
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB_ENV}
    env.setdefault("OMP_NUM_THREADS", "1")
    fork = can_fork(plan)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ups-preflight-ar-") as tmp:
        procs: dict[int, subprocess.Popen[bytes] | _ForkedRank] = {}
        for rank in ranks:
            out_path, err_path = Path(tmp, f"rank{rank}.out"), Path(tmp, f"rank{rank}.err")
            with out_path.open("wb") as out, err_path.open("wb") as err:
                if fork:
                    procs[rank] = _ForkedRank(plan.worker_args(rank), out_path, err_path)
                else:
                    procs[rank] = subprocess.Popen(
                        plan.command(rank), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                        env=env,
                    )  # fmt: skip
        deadline = start + plan.timeout_s
        failed_early = False
        while time.perf_counter() < deadline:
            codes = {r: p.poll() for r, p in procs.items()}
            if all(c is not None for c in codes.values()):
                break
            if any(c not in (None, 0) for c in codes.values()):
                failed_early = True
                break
            time.sleep(_POLL_S)  # supervising child processes: nothing to wait on jointly
        killed = []
        for rank, p in procs.items():
            if p.poll() is None:
                p.kill()
                p.wait()
                killed.append(rank)
        run = AllReduceRun(ok=False, elapsed_s=time.perf_counter() - start)
        for rank, p in procs.items():
            run.exit_codes[rank] = None if rank in killed else p.returncode
            tail = Path(tmp, f"rank{rank}.err").read_text(errors="replace").strip()
            if tail:
                run.stderr_tail[rank] = tail[-1500:]
        missing = sorted(set(range(plan.world_size)) - set(ranks))
        if killed and not failed_early:
            run.error = (
                f"rank(s) {', '.join(map(str, killed))} did not finish within "
                f"{plan.timeout_s:g} s"
                + (f"; rank(s) {missing} never started" if missing else "")
                + " (a peer never joined or the collective hung)"
            )
            return run
        bad = {r: c for r, c in run.exit_codes.items() if c not in (0, None)}
        if bad:
            run.error = "worker(s) failed: " + ", ".join(
                f"rank {r} exit code {c}" for r, c in sorted(bad.items())
            )
            return run
        lines = Path(tmp, "rank0.out").read_text().strip().splitlines() if 0 in procs else []
        if not lines:
            run.error = "rank 0 reported nothing"
            return run
        report: dict[str, Any] = json.loads(lines[-1])
    run.wrong = int(report["wrong"])
    run.sizes = report["sizes"]
    run.ok = run.wrong == 0
    if not run.ok:
        run.error = f"{run.wrong} wrong element(s) after all-reduce"
    return run


def judge(plan: AllReducePlan, run: AllReduceRun, min_busbw: float | None) -> CheckResult:
    """Turn a run into a result: correctness first, then busbw against its floor."""
    where = (
        f"nccl on {plan.world_size}x {plan.gpu_name}"
        if plan.backend == "nccl"
        else f"gloo on CPU (no GPU), {plan.world_size} processes"
    )
    details: dict[str, Any] = {
        "backend": plan.backend,
        "world_size": plan.world_size,
        "gpu_name": plan.gpu_name,
        "sizes": run.sizes,
        "exit_codes": run.exit_codes,
        "stderr_tail": run.stderr_tail,
        "elapsed_s": round(run.elapsed_s, 3),
        "wrong": run.wrong,
    }
    if not run.ok:
        return CheckResult(
            name="allreduce",
            status=Status.FAIL,
            message=f"{where}: {run.error}",
            hint="rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL ups-preflight "
            "--only allreduce; check for leftover processes (nvidia-smi) and /dev/shm size",
            details=details,
        )
    largest = run.sizes[-1]
    busbw = round(float(largest["busbw_gbps"]), 3)
    summary = (
        f"{where}: 0 wrong, busbw {busbw:g} GB/s (algbw {largest['algbw_gbps']:.3g}) "
        f"at {int(largest['bytes']) >> 20} MiB"
    )
    if plan.backend == "gloo":
        return CheckResult(
            name="allreduce",
            status=Status.PASS,
            message=summary + "; CPU: report only",
            value=busbw,
            unit="GB/s",
            details=details,
        )
    if plan.world_size == 1:
        return CheckResult(
            name="allreduce",
            status=Status.PASS,
            message=f"{where}: 0 wrong; one GPU moves no data between GPUs, busbw n/a",
            value=busbw,
            unit="GB/s",
            details=details,
        )
    floor, basis = floor_gbps(plan.gpu_name or "", plan.world_size, min_busbw)
    details["threshold_basis"] = basis
    if floor is None or busbw >= floor:
        return CheckResult(
            name="allreduce",
            status=Status.PASS,
            message=f"{summary} ({basis})",
            value=busbw,
            threshold=floor,
            unit="GB/s",
            details=details,
        )
    return CheckResult(
        name="allreduce",
        status=Status.FAIL,
        message=f"{summary}, below the {floor:g} GB/s floor ({basis})",
        value=busbw,
        threshold=floor,
        unit="GB/s",
        hint="check NVLink/PCIe topology (nvidia-smi topo -m) and that no other job shares "
        "the GPUs; rent another host if it persists",
        details=details,
    )


def run(ctx: Context) -> CheckResult:
    # Leave the runner's own deadline a margin so this check reports its own failure.
    timeout = max(5.0, ctx.timeout("allreduce", 90.0) - 5.0)
    plan = plan_for(ctx, timeout)
    min_busbw = ctx.opts.min_busbw_gbps
    if min_busbw is None and ctx.cfg is not None:
        min_busbw = ctx.cfg.preflight.min_busbw_gbps
    return judge(plan, execute(plan), min_busbw)
