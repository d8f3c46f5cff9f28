"""`ups launch CONFIG` with the bundled trainer: finish, preempt with SIGTERM, resume."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, parse_events, worker_env
from tests.launch_helpers import launch_cmd, outcome_of, run_launch, wait_for_event

pytestmark = pytest.mark.slow


def test_trainer_finishes_through_launch(make_config: Callable[..., Path], tmp_path: Path) -> None:
    """`ups launch CONFIG` runs the trainer on 2 ranks: exit 0, outcome finished with the
    step count, per-rank logs and a checkpoint in the run dir, `latest` pointing at it."""
    config = make_config(training={"max_steps": 4})
    proc = run_launch(str(config), "--preflight-skip", "allreduce")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run_dir = (tmp_path / "runs" / "latest").resolve()
    outcome = outcome_of(run_dir)
    assert (outcome["outcome"], outcome["step"], outcome["world_size"]) == ("finished", 4, 2)
    assert {p.name for p in (run_dir / "logs").iterdir()} >= {
        "launch.log", "rank0.jsonl", "rank1.jsonl",
    }  # fmt: skip
    assert list((run_dir / "checkpoints").glob("step_*.pt"))


def test_trainer_segfault_names_rank_and_signal(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """An injected segfault on rank 1 of the real trainer: launch exits 1 and outcome.json
    names rank 1 and SIGSEGV, with rank 1's log (holding the faulthandler stack) to read."""
    config = make_config(
        training={"max_steps": 20}, faults=[{"kind": "segfault", "rank": 1, "step": 2}]
    )
    proc = run_launch(str(config), "--run-id", "sf", "--skip-preflight")
    assert proc.returncode == 1, proc.stdout[-3000:]
    outcome = outcome_of(tmp_path / "runs" / "sf")
    assert (outcome["outcome"], outcome["failed_rank"], outcome["signal"]) == (
        "failed", 1, "SIGSEGV",
    )  # fmt: skip
    assert "rank 1 died with SIGSEGV" in outcome["reason"]
    assert "Segmentation fault" in Path(outcome["traceback"]).read_text()


def test_sigterm_preempts_with_75_and_the_run_id_resumes(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGTERM to `ups launch` (what `docker stop` sends) reaches the trainer: a checkpoint,
    outcome "preempted", exit 75. Relaunching with --run-id resumes and finishes."""
    config = make_config(training={"max_steps": 100_000, "epochs": 1000})
    run_dir = tmp_path / "runs" / "pre"
    proc = subprocess.Popen(
        launch_cmd(str(config), "--run-id", "pre", "--skip-preflight"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=worker_env(), cwd=REPO,
    )  # fmt: skip
    try:
        wait_for_event(run_dir / "logs" / "launch.log", "train_step", proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, out[-3000:]
    outcome = outcome_of(run_dir)
    assert outcome["outcome"] == "preempted" and outcome["checkpoint"]
    assert Path(outcome["checkpoint"]).exists()
    stopped_at = outcome["step"]
    last = json.loads(out.strip().splitlines()[-1])
    assert (last["outcome"], last["exit_code"]) == ("preempted", 75)

    resumed = run_launch(
        str(config), "--run-id", "pre", "--skip-preflight",
        "--set", f"training.max_steps={stopped_at + 2}",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert any(e["event"] == "resumed" for e in parse_events(resumed.stdout))
    assert outcome_of(run_dir)["outcome"] == "finished"
    assert json.loads((run_dir / "outcome.previous.json").read_text())["outcome"] == "preempted"
