"""Pure pieces of the fault runtime, checked against real inputs: a real
faulthandler dump from a stuck process, the launch plan's GPU env, fault specs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ups.config.faults import parse_faults
from ups.distributed.agreement import agree_local, status_length
from ups.distributed.gradbuf import GradBuffer
from ups.distributed.stacks import DUMP_SIGNAL, parse_dump, where_stuck
from ups.launch.plan import LaunchRequest, build_plan
from ups.outcome import EXIT_NONFINITE
from ups.preflight.checks.ports import pick_free_port
from ups.train.failures import nonfinite_metrics
from ups.train.faults import FaultInjector

STUCK = """
import sys, threading, time
from ups.distributed.stacks import enable_stack_dumps
log = open(sys.argv[1], "a")
enable_stack_dumps(log)
log.write('{"event": "a json line before the dump"}\\n'); log.flush()
threading.Thread(target=lambda: time.sleep(600), daemon=True).start()  # a 2nd stack
def stuck_here():
    print("ready", flush=True)
    time.sleep(600)  # the stuck state under test; the test dumps its stack, then kills it
stuck_here()
"""


@pytest.mark.slow
def test_a_stuck_process_dump_names_its_main_thread_frame(tmp_path: Path) -> None:
    """SIGUSR1 makes a stuck process write every thread's stack into its log; the parser
    names the main thread's innermost frame (file:line in function), not the helper's."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    log = tmp_path / "rank1.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # let it enter time.sleep in stuck_here
        proc.send_signal(DUMP_SIGNAL)
        deadline = time.monotonic() + 20
        threads = []
        while time.monotonic() < deadline and len(threads) < 2:
            time.sleep(0.2)
            threads = parse_dump(log.read_text())
        assert len(threads) == 2, log.read_text()
        assert proc.poll() is None  # the dump does not kill it (chain=False, no default action)
        where = where_stuck(threads)
        assert where is not None and where.startswith(f"{script}:10 in stuck_here"), where
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_gpu_workers_get_the_nccl_flight_recorder(tmp_path: Path) -> None:
    """On a GPU host the workers' env turns on the NCCL flight recorder, dumping into the
    run directory; a CPU host gets none of it; a user's own setting wins."""
    req = LaunchRequest(script="train.py", output_dir=str(tmp_path), run_id="r1")
    gpu = build_plan(req, None, gpu_count=2, pick_port=lambda p: p, environ={}).env
    assert gpu["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert gpu["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert int(gpu["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert gpu["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path / 'r1'}/nccl_trace/rank_"
    cpu = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={}).env
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in cpu
    own = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    assert (
        build_plan(req, None, gpu_count=1, pick_port=lambda p: p, environ=own).env[
            "TORCH_NCCL_TRACE_BUFFER_SIZE"
        ]
        == "50"
    )


def test_fault_specs_name_a_point_in_the_step() -> None:
    """UPS_FAULTS=kind@rank:step[:point]; a wrong point is named with the allowed ones."""
    faults = parse_faults("oom@1:3:optimizer,nan@0:2,hang@1:4")
    assert [(f.kind, f.rank, f.step, f.point) for f in faults] == [
        ("oom", 1, 3, "optimizer"),
        ("nan", 0, 2, "start"),
        ("hang", 1, 4, "start"),
    ]
    with pytest.raises(ValueError, match="point one of start, forward, backward, pack"):
        parse_faults("oom@1:3:elsewhere")


def test_a_nonfinite_eval_metric_is_a_failure_not_a_finish() -> None:
    """A NaN or inf evaluation metric makes the run fail with the non-finite exit code,
    naming each bad metric; finite metrics pass."""
    assert nonfinite_metrics({"eval/a/rel_l2": 0.1, "eval/a/samples": 20.0}) is None
    failed = nonfinite_metrics({"eval/a/rel_l2": float("nan"), "eval/b/rel_l2": float("inf")})
    assert failed is not None and failed.exit_code == EXIT_NONFINITE
    assert "eval/a/rel_l2=nan" in failed.reason and "eval/b/rel_l2=inf" in failed.reason
    assert "training.lr" in failed.reason


def test_a_pause_holds_the_step_until_the_run_is_asked_to_stop() -> None:
    """A ``pause`` fault returns from its step only once the stop flag is set (what SIGTERM
    does), asleep meanwhile; other steps and the other rank's faults are untouched; on the
    data loader it is a config error."""
    flag = threading.Event()
    (mine,) = parse_faults("pause@0:2")
    injector = FaultInjector([mine], 0, under_torchrun=False, stopping=flag.is_set)
    injector.fire(1)  # not its step: returns at once
    threading.Timer(0.5, flag.set).start()
    started, cpu = time.monotonic(), time.process_time()
    injector.fire(2)
    assert time.monotonic() - started >= 0.45  # held until the flag was set
    assert time.process_time() - cpu < 0.2  # asleep, not spinning
    with pytest.raises(ValueError, match="kind pause holds the training process"):
        parse_faults("pause@1:2:loader")


def test_the_gradient_check_finds_any_nan_or_inf_and_nothing_else() -> None:
    """A NaN, +inf or -inf anywhere in the flat gradients flags the rank; finite values up
    to float32's largest do not (the check cannot overflow)."""
    params = [torch.zeros(3, 5, requires_grad=True), torch.zeros(7, requires_grad=True)]
    grads = GradBuffer(params)
    for value in (3.0e38, -3.0e38, 1e-45, 0.0):
        grads.flat.fill_(value)
        assert not bool(grads.nonfinite())
    for position in (0, 14, 15, 21):
        for bad in (float("nan"), float("inf"), float("-inf")):
            grads.flat.fill_(1.0)
            grads.flat[position] = bad
            assert bool(grads.nonfinite()), (position, bad)


def test_point_one_rides_in_the_gradient_all_reduce() -> None:
    """The status row travels in the buffer's tail: the verdict holds the exact fp32 losses
    and flags, the gradients are summed by the same collective and untouched by the row."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{pick_free_port(0, '127.0.0.1')}", rank=0,
        world_size=1,
    )  # fmt: skip
    try:
        params = [torch.zeros(4, requires_grad=True)]
        grads = GradBuffer(params, status_length(2))
        assert params[0].grad is not None
        params[0].grad.copy_(torch.tensor([1.0, -2.0, 3.5, 0.25]))
        losses = torch.tensor([0.123456789, float("nan")])
        verdict = agree_local(
            oom=False, nonfinite=grads.nonfinite(), losses=losses, n_tasks=2,
            save_failed=False, stop=True, rank=0, world_size=1, device=torch.device("cpu"),
            exchange_rows=grads.exchange,
        )  # fmt: skip
        assert verdict.stop and not verdict.oom_ranks and not verdict.nonfinite_ranks
        assert verdict.losses[0][0] == float(losses[0])  # the fp32 value, exactly
        assert verdict.losses[0][1] != verdict.losses[0][1]  # NaN reaches the reason text
        grads.average(1)
        assert params[0].grad.tolist() == [1.0, -2.0, 3.5, 0.25]
    finally:
        dist.destroy_process_group()
