"""`--max-restarts`: torchrun relaunched in place from the last checkpoint after a
retryable failure (ending bit-exactly where an uninterrupted run ends), never after a
deterministic one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import parse_events, uninterrupted_run
from tests.lifecycle_helpers import crashed_launch, diverged_launch, final_model, outcome, run

pytestmark = pytest.mark.slow


def test_max_restarts_relaunches_torchrun_after_a_sigkill(
    make_config: Callable[..., Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Rank 1 is SIGKILLed at step 6 with --max-restarts 1: launch logs the restart,
    relaunches torchrun, which resumes from step 4 and finishes; exit 0 and the outcome
    counts 1 restart and lists both attempts (the first with its SIGKILL explanation). The
    final weights equal an uninterrupted run's bit for bit (the shared reference of this
    config; the backoff is set on the command line so the config is the reference's)."""
    cfg = make_config(training={"max_steps": 12}, checkpoint={"every_steps": 4})
    reference = final_model(uninterrupted_run(tmp_path_factory, cfg))  # shared (conftest)
    proc = run(
        str(tmp_path), str(cfg), "--skip-preflight", "--max-restarts", "1",
        "--set", "distributed.restart_backoff_s=1", env={"UPS_FAULTS": "sigkill@1:6"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "restarting torchrun from the last checkpoint in 1 s (restart 1 of 1)" in proc.stdout
    run_dir = (tmp_path / "runs" / "latest").resolve()
    out = outcome(run_dir)
    assert (out["outcome"], out["restarts"], len(out["attempts"])) == ("finished", 1, 2)
    first, second = out["attempts"]
    assert (first["cause"], first["outcome"]) == ("rank_signal", "failed")
    assert first["memory"]["oom_killer"] is False
    assert second["outcome"] == "finished"
    assert out["resumed_from"]["step"] == 4
    assert any(e["event"] == "faults_disarmed" for e in parse_events(proc.stdout))
    weights = final_model(run_dir)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), f"{name} differs after the restart"


def test_deterministic_failure_is_neither_restarted_nor_resumed(
    tiny_data: dict[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A Python exception on rank 1 with --max-restarts 2 (the shared crashed launch,
    :func:`crashed_launch`): one attempt only, exit 1, cause `exception`; the same command
    then plans a new run and says why it does not resume."""
    crashed = crashed_launch(tmp_path_factory, tiny_data)
    assert crashed.returncode == 1, crashed.stdout[-3000:]
    run_dir = (crashed.output_dir / "latest").resolve()
    out = outcome(run_dir)
    assert (out["cause"], out["restarts"], len(out["attempts"])) == ("exception", 0, 1)
    assert "restarting torchrun" not in crashed.stdout
    plan = run(str(tmp_path), str(crashed.config), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["run_id"] != run_dir.name and planned["resume"] is None
    assert "Python exception" in planned["resume_note"]


def test_diverging_run_exits_65_through_launch_and_is_not_resumed(
    tiny_data: dict[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`ups launch --set training.lr=1e6 --max-restarts 2` (the shared diverged launch,
    :func:`diverged_launch`): exit 65 (not torchrun's 1), one attempt, cause `nonfinite`, a
    reason that names the fix and not torchrun's teardown of the slower rank; the same
    command then starts a new run instead of resuming."""
    diverged = diverged_launch(tmp_path_factory, tiny_data)
    assert diverged.returncode == 65, diverged.stdout[-3000:]
    run_dir = (diverged.output_dir / "latest").resolve()
    out = outcome(run_dir)
    assert (out["cause"], out["exit_code"], len(out["attempts"])) == ("nonfinite", 65, 1)
    assert "lower training.lr" in out["reason"] and "torchrun:" not in out["reason"]
    plan = run(str(tmp_path), str(diverged.config), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["run_id"] != run_dir.name and planned["resume"] is None
