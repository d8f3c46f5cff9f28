"""A signal at any phase of `ups launch` ends every process the run started, and the
outcome names the phase."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.launch_helpers import ALLREDUCE, write_script
from tests.lifecycle_helpers import assert_no_survivors, finish, outcome, start, wait_for

pytestmark = pytest.mark.slow


def _wait_for_children(proc: psutil.Process, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(proc.children(recursive=True)) >= n:
            return
        time.sleep(0.1)  # watching another process's children appear
    raise AssertionError(f"launch never had {n} child processes")


def test_sigterm_during_the_preflight_allreduce_leaves_no_worker_behind(tmp_path: Path) -> None:
    """SIGTERM while preflight's all-reduce workers run: exit 143, outcome phase preflight,
    and the all-reduce workers are gone with launch (they used to outlive it)."""
    script = write_script(tmp_path, "ok.py", ALLREDUCE)
    proc = start(str(tmp_path), "--script", str(script), "--run-id", "p",
                 "--output-dir", str(tmp_path / "runs"))  # fmt: skip
    _wait_for_children(psutil.Process(proc.pid), 2, timeout=120)  # the check's 2 workers
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=120)
    assert proc.returncode == 143, out[-3000:]
    assert_no_survivors(str(tmp_path))
    out_json = outcome(tmp_path / "runs" / "p")
    assert (out_json["phase"], out_json["cause"]) == ("preflight", "stopped")


@pytest.mark.parametrize(
    ("phase_event", "phases"),
    [
        ({"event": "torchrun_starting"}, {"torchrun_start", "data_check", "init", "training",
                                          "final_save"}),
        ({"event": "phase", "phase": "data_check"}, {"data_check", "init", "training",
                                                     "final_save"}),
        ({"event": "phase", "phase": "training"}, {"training", "final_save"}),
    ],
    ids=["torchrun-start", "data-check", "training"],
)  # fmt: skip
def test_sigterm_at_a_phase_ends_every_process_and_names_it(
    make_config: Callable[..., Path],
    tmp_path: Path,
    phase_event: dict[str, str],
    phases: set[str],
) -> None:
    """SIGTERM as torchrun starts, during the data check or training: launch ends (75
    preempted, or 143 when the workers had not installed their handler yet), the outcome
    names a phase of that moment, and no process survives."""
    cfg = make_config(training={"max_steps": 100_000, "epochs": 1000})
    log = tmp_path / "runs" / "latest" / "logs" / "launch.log"
    proc = start(str(tmp_path), str(cfg), "--skip-preflight")
    wait_for(log, proc, 240, **phase_event)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=300)
    assert proc.returncode in (75, 143), out[-3000:]
    assert_no_survivors(str(tmp_path))
    result = outcome((tmp_path / "runs" / "latest").resolve())
    assert result["phase"] in phases, result
    assert result["outcome"] in ("preempted", "failed")
