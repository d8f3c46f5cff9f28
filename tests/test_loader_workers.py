"""DataLoader workers in the real trainer (2 gloo ranks under torchrun, real HDF5 files).

Workers change where batches are read, never which: the weights match in-process loading,
a preempted run with workers resumes onto the same batches, a dead worker fails the run
on every rank within seconds and is named, and no worker outlives its run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import torchrun, uninterrupted_run
from tests.fault_helpers import events, survivors
from tests.launch_helpers import events_named, outcome_of, run_launch
from ups.config import FaultConfig, TaskConfig
from ups.data.loader import build_loader, loader_shm_bytes
from ups.data.pdebench import inspect_task
from ups.outcome import EXIT_PREEMPTED, read_outcome
from ups.retry import retry_verdict
from ups.train.checkpoint import list_checkpoints, load_checkpoint
from ups.train.faults import FaultInjector
from ups.worker_death import WorkerDeath, worker_death

pytestmark = pytest.mark.slow


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _, newest = list_checkpoints(run_dir / "checkpoints")[-1]
    state: dict[str, torch.Tensor] = load_checkpoint(newest)["model"]
    return state


def _worker_pids(run_dir: Path, rank: int) -> list[int]:
    return [e["pid"] for e in events(run_dir, rank, "loader_worker_started")]


def _gone(pids: list[int], marker: str, within_s: float = 20.0) -> list[str]:
    """Processes of the run still alive after ``within_s`` (torch's worker watchdog polls
    every 5 s, so a worker whose rank died may take that long)."""
    deadline = time.monotonic() + within_s
    while (left := survivors(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling /proc for processes to exit, not synchronisation
    return left + [str(p) for p in pids if Path(f"/proc/{p}").exists() and marker in _cmd(p)]


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_workers_give_the_weights_of_in_process_loading_and_resume_exactly(
    make_config: Callable[..., Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Both tasks read by 2 workers per rank, preempted by SIGTERM at step 3 and resumed,
    end with weights bit-identical to an uninterrupted run that reads in process (the
    shared reference of this config without workers, conftest.uninterrupted_run): the
    batches are the same, the preemption checkpoint is written (the SIGTERM torchrun sends
    to each rank's process group does not kill the workers), and no worker is left."""
    # max_steps 12 and the default loader (num_workers 0): the config whose uninterrupted
    # run other tests (test_faults, test_lifecycle_sigkill, ...) compare with too.
    inproc = make_config(run={"run_id": "inproc"}, training={"max_steps": 12})
    reference = uninterrupted_run(tmp_path_factory, inproc)
    assert not _worker_pids(reference, 0), "the reference must read in process"
    config = make_config(run={"run_id": "workers"}, training={"max_steps": 12, "num_workers": 2})
    first = torchrun(config, env={"UPS_FAULTS": "sigterm@0:3"})
    assert first.returncode != 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "workers"
    assert outcome_of(run_dir)["outcome"] == "preempted"
    assert outcome_of(run_dir)["exit_code"] == EXIT_PREEMPTED
    # torchrun forwards the SIGTERM asynchronously: under load the ranks may finish step 4
    # before it lands, so the stop step is read, not assumed; the resume must start there.
    stopped_at = outcome_of(run_dir)["step"]
    assert 3 <= stopped_at < 12, stopped_at
    pids = [_worker_pids(run_dir, rank) for rank in (0, 1)]
    assert [len(p) for p in pids] == [2, 2], pids  # per rank, serving both tasks
    resumed = torchrun(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert outcome_of(run_dir)["outcome"] == "finished"
    assert events(run_dir, 0, "resumed")[-1]["step"] == stopped_at
    want, got = _final_model(reference), _final_model(run_dir)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert _gone([p for rank in pids for p in rank], str(config)) == []


def _time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def test_a_killed_worker_fails_every_rank_soon_naming_its_pid_and_signal(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """A DataLoader worker of rank 1 SIGKILLed as it reads step 4 (as the OOM killer would):
    `ups launch` exits non-zero within seconds, outcome.json names rank 1, the worker's pid
    and SIGKILL with the fix, cause `loader_died` (retried), and no process is left."""
    config = make_config(
        training={"max_steps": 1000, "epochs": 100, "num_workers": 2},
        faults=[{"kind": "sigkill", "rank": 1, "step": 4, "point": "loader"}],
    )
    proc = run_launch(str(config), "--run-id", "wk", "--skip-preflight")
    ended = time.time()
    assert proc.returncode != 0, proc.stdout[-3000:]
    run_dir = tmp_path / "runs" / "wk"
    outcome = outcome_of(run_dir)
    pids = _worker_pids(run_dir, 1)
    (killed,) = [e for e in events(run_dir, 1, "fault_injected") if e["point"] == "loader"]
    assert (outcome["outcome"], outcome["failed_rank"], outcome["cause"]) == (
        "failed", 1, "loader_died",
    ), outcome  # fmt: skip
    named = re.search(
        r"rank 1 .*DataLoader worker \(pid (\d+)\) was killed by SIGKILL", outcome["reason"]
    )
    assert named is not None and int(named[1]) in pids, (outcome["reason"], pids)
    assert "OOM killer" in outcome["reason"]  # the fix comes with it
    assert retry_verdict(read_outcome(run_dir))[0]  # the same command resumes it
    assert ended - _time(killed) < 60, "the run took too long to end after the worker died"
    assert not events_named(proc.stdout, "leftover_processes_ended"), "launch had to sweep"
    assert _gone(pids + _worker_pids(run_dir, 0), str(config)) == []


def test_shm_estimate_counts_workers_prefetch_and_batch(tmp_path: Path, tiny_data) -> None:
    """Workers hand batches over through /dev/shm: none without workers, and per rank
    (workers x prefetch + 2) whole steps of every task's batch with them."""
    tasks = [
        TaskConfig(name="advection", layout="single_1d", path=tiny_data["advection"]),
        TaskConfig(name="darcy", layout="darcy_2d", path=tiny_data["darcy"]),
    ]
    infos = {t.name: inspect_task(t) for t in tasks}
    item = (2 * 4 * 64 + 8) + (2 * 4 * 16 * 16 + 8)
    assert loader_shm_bytes(infos, 32, 0, 2) == 0
    assert loader_shm_bytes(infos, 32, 3, 4) == (3 * 4 + 2) * 32 * item
    loader = build_loader(tasks, infos, batch_size=16, num_workers=0, rank=0, world_size=1, seed=0)
    loader.set_epoch(0)
    batch = next(iter(loader))  # a full batch of both tasks: the estimate is exact
    assert sum(t.numel() * t.element_size() for b in batch.values() for t in b) == 16 * item


def test_a_dead_worker_is_reported_with_its_pid_and_signal(tiny_data) -> None:
    """A worker SIGKILLed while it reads step 1 makes the loader raise an error that
    names that worker's pid and SIGKILL (the outcome's reason and cause are read from it),
    however torch noticed the death first."""
    tasks = [TaskConfig(name="darcy", layout="darcy_2d", path=tiny_data["darcy"])]
    infos = {t.name: inspect_task(t) for t in tasks}
    fault = FaultConfig(kind="sigkill", rank=0, step=1, point="loader")
    injector = FaultInjector([fault], 0, under_torchrun=False)
    loader = build_loader(
        tasks, infos, batch_size=4, num_workers=1, rank=0, world_size=1, seed=0, injector=injector
    )
    loader.set_epoch(0)
    with pytest.raises(RuntimeError) as raised:
        list(loader)
    loader.close()
    death = worker_death(str(raised.value))
    assert death is not None and death.signal == "SIGKILL", str(raised.value)
    assert "was killed by SIGKILL" in death.describe()
    assert worker_death("DataLoader worker (pid(s) 12, 13) exited unexpectedly") == WorkerDeath(
        (12, 13), None, None
    )
