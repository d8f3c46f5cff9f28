"""The all-reduce check with real worker processes (gloo on CPU here, nccl on a GPU host)."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import socket
import time

import pytest
import torch
import torch.distributed as dist

from tests.fixtures.preflight_helpers import run_check
from ups.preflight import Status
from ups.preflight.checks.allreduce import AllReducePlan, AllReduceRun, can_fork, execute, judge
from ups.preflight.checks.ports import pick_free_port


def _plan(timeout_s: float, **kw: object) -> AllReducePlan:
    defaults: dict[str, object] = dict(
        backend="gloo", world_size=2, port=pick_free_port(0, "127.0.0.1"),
        sizes=(1 << 16, 1 << 20), iters=3, warmup=1, timeout_s=timeout_s,
    )  # fmt: skip
    defaults.update(kw)
    return AllReducePlan(**defaults)  # type: ignore[arg-type]  # values are object


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the GPU-less path")
def test_gloo_on_cpu_passes_and_says_so() -> None:
    """Without GPUs the check runs gloo over 2 CPU processes, is correct, and reports busbw;
    forked from a process whose OpenMP pool has run (as torch's own work leaves it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    a = torch.ones(512, 512)
    assert float((a @ a)[0, 0]) == 512
    torch.set_num_threads(threads)
    result = run_check("allreduce")
    assert result.status is Status.PASS, result.message
    assert "gloo on CPU (no GPU), 2 processes: 0 wrong" in result.message
    assert result.unit == "GB/s" and isinstance(result.value, float) and result.value > 0
    sizes = result.details["sizes"]
    assert [s["bytes"] for s in sizes] == [256 * 1024, 1 << 20, 4 << 20, 16 << 20]
    for s in sizes:  # nccl-tests formulas, n = 2
        assert s["algbw_gbps"] == pytest.approx(s["bytes"] / s["time_s"] / 1e9)
        assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * (2 - 1) / 2)


@pytest.mark.slow
def test_peer_that_never_joins_fails_within_the_timeout() -> None:
    """Rank 1 never starts: rank 0 waits in rendezvous, and the check fails at its deadline."""
    plan = _plan(timeout_s=8.0)
    start = time.perf_counter()
    run = execute(plan, ranks=[0])
    elapsed = time.perf_counter() - start
    assert not run.ok
    assert elapsed < plan.timeout_s + 3
    assert run.exit_codes == {0: None}  # killed at the deadline
    assert run.error is not None
    assert "rank(s) 0 did not finish within 8 s; rank(s) [1] never started" in run.error
    result = judge(plan, run, None)
    assert result.status is Status.FAIL and "never joined" in result.message
    assert multiprocessing.active_children() == []  # the forked rank was reaped


@pytest.mark.slow
def test_forked_worker_that_fails_reports_its_error() -> None:
    """Rank 0 cannot listen on a port taken by another socket: the check fails at once with
    rank 0's own error text, and the waiting rank 1 is killed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        plan = _plan(timeout_s=60.0, port=taken.getsockname()[1])
        assert can_fork(plan)
        run = execute(plan)
    assert not run.ok and run.elapsed_s < 30
    assert run.error == "worker(s) failed: rank 0 exit code 1"
    assert run.exit_codes[1] is None  # killed, not left waiting
    assert "EADDRINUSE" in run.stderr_tail[0]


def test_workers_are_forked_only_where_that_is_safe() -> None:
    """gloo workers fork from a plain process; nccl ones, and any from a process that is
    itself in a process group (a forked child would inherit it), start fresh."""
    assert can_fork(_plan(60.0))
    assert not can_fork(_plan(60.0, backend="nccl"))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{pick_free_port(0, '127.0.0.1')}", rank=0,
        world_size=1, timeout=dt.timedelta(seconds=30),
    )  # fmt: skip
    try:
        assert not can_fork(_plan(60.0))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_four_cpu_processes_sum_correctly() -> None:
    """With 4 ranks the known pattern still sums exactly (0 wrong) and busbw uses 2(n-1)/n."""
    run = execute(_plan(timeout_s=60.0, world_size=4))
    assert run.ok and run.wrong == 0, run.error
    s = run.sizes[-1]
    assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * 3 / 4)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_crashing_worker_fails_fast() -> None:
    """Workers that die (nccl without CUDA) fail the check at once, with exit codes and stderr."""
    plan = _plan(timeout_s=60.0, backend="nccl")
    run = execute(plan)
    assert not run.ok and run.elapsed_s < 30
    assert run.error is not None and run.error.startswith("worker(s) failed: rank")
    assert run.stderr_tail


def _measured(busbw: float) -> AllReduceRun:
    return AllReduceRun(ok=True, elapsed_s=1.0, wrong=0, sizes=[
        {"bytes": 512 << 20, "time_s": 0.01, "algbw_gbps": busbw / 1.75, "busbw_gbps": busbw}
    ])  # fmt: skip


def test_nccl_busbw_is_judged_against_the_gpu_table() -> None:
    """8x H100 SXM below 0.9x 460 GB/s fails; above passes; --min-busbw overrides the table."""
    plan = _plan(60.0, backend="nccl", world_size=8, gpu_name="NVIDIA H100 80GB HBM3")
    slow = judge(plan, _measured(300.0), None)
    assert slow.status is Status.FAIL and slow.threshold == 414.0
    assert judge(plan, _measured(450.0), None).status is Status.PASS
    assert judge(plan, _measured(300.0), 250.0).status is Status.PASS
    unknown = judge(_plan(60.0, backend="nccl", world_size=3, gpu_name="NVIDIA L4"),
                    _measured(10.0), None)  # fmt: skip
    assert unknown.status is Status.PASS and unknown.threshold is None


@pytest.mark.gpu
@pytest.mark.slow  # the check starts one worker process per GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_on_real_gpus() -> None:
    """On a GPU host the check runs nccl, one process per GPU, and is correct."""
    result = run_check("allreduce")
    assert result.status is Status.PASS, result.message
    assert result.details["backend"] == "nccl"
    assert result.details["wrong"] == 0
