"""W&B is a copy of the run's metrics, not the run: when its own process dies (on Slurm a
job's SIGTERM reaches wandb-core as well as the ranks) the run goes on, says so once, and
ends as it really ends. Before, rank 0's next `wandb.log` raised ConnectionResetError and
a preemption was reported as `rank 0 failed ... Connection lost`."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from ups.config import load_config
from ups.log import setup_logging
from ups.train.tracking import Tracker

pytestmark = pytest.mark.slow  # wandb starts its own service process


def _cmdline(proc: psutil.Process) -> str:
    """A child's command line; empty for one gone or a zombie (the worker runs other tests
    in-process too, and a child of theirs may be exiting right now)."""
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return ""


def test_a_killed_wandb_service_is_said_once_and_training_goes_on(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    cfg = load_config(make_config(wandb={"mode": "offline"}))
    log_file = tmp_path / "rank0.jsonl"
    setup_logging(console=False, log_file=log_file)
    tracker = Tracker()
    tracker.start(cfg, run_id="lost", run_dir=tmp_path / "run", rank=0)
    tracker.log({"train/loss": 1.0}, step=0)
    children = psutil.Process(os.getpid()).children(recursive=True)
    services = [p for p in children if "wandb" in _cmdline(p)]
    assert services, [_cmdline(p) for p in children]
    for proc in services:
        proc.send_signal(signal.SIGTERM)
    psutil.wait_procs(services, timeout=30)
    for step in range(1, 40):  # W&B notices the lost socket within a few calls
        tracker.log({"train/loss": 1.0 / step}, step=step)
    tracker.summary({"eval/loss": 0.5})
    tracker.finish(0)  # no exception anywhere above
    setup_logging(console=False)
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    lost = [e for e in events if e["event"] == "wandb_lost"]
    assert len(lost) == 1, lost
    assert "training goes on without it" in lost[0]["text"]
    assert "logs/rank0.jsonl" in lost[0]["text"]
