"""Preemption within the configured grace: a checkpoint that takes longer than torchrun's
default 30 s still completes; a grace too short leaves the previous checkpoint to resume."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import parse_events
from tests.lifecycle_helpers import (
    assert_no_survivors,
    finish,
    last_event,
    outcome,
    run,
    start,
    wait_for,
)
from ups.retry import resume_hint
from ups.train.checkpoint import list_checkpoints, load_checkpoint
from ups.train.faults import SLOW_SAVE_S

pytestmark = pytest.mark.slow


def test_slow_checkpoint_under_sigterm_completes_and_the_same_command_resumes(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGTERM to `ups launch` (what `docker stop` sends) during training while every save
    takes 35 s more: it reaches the trainer, launch waits past 30 s, the checkpoint is
    written, outcome preempted (exit 75, phase final_save; launch's last line says so),
    nothing survives, and the same command resumes from that step and finishes, keeping the
    preempted outcome as outcome.previous.json. Run as a Slurm job's step would be
    (``SLURM_JOB_ID`` set), the trainer's reason and launch's end line both say the requeue
    brings the job back, not "run the same command again"."""
    cfg = make_config(training={"max_steps": 100_000, "epochs": 1000},
                      checkpoint={"every_steps": 100_000})  # fmt: skip
    log = tmp_path / "runs" / "latest" / "logs" / "launch.log"
    env = {"UPS_FAULTS": "slow_save@0:0", "SLURM_JOB_ID": "4242"}
    proc = start(str(tmp_path), str(cfg), "--skip-preflight", env=env)
    wait_for(log, proc, 240, event="train_step")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=300)
    waited = time.monotonic() - sent
    assert proc.returncode == 75, out[-3000:]
    assert waited >= SLOW_SAVE_S  # the save outlasted torchrun's default 30 s and completed
    assert_no_survivors(str(tmp_path))
    run_dir = (tmp_path / "runs" / "latest").resolve()
    pre = outcome(run_dir)
    assert (pre["outcome"], pre["cause"], pre["phase"]) == ("preempted", "preempted", "final_save")
    assert Path(pre["checkpoint"]).is_file()
    assert (last_event(out)["outcome"], last_event(out)["exit_code"]) == ("preempted", 75)
    requeue = resume_hint(checkpoint=pre["checkpoint"], environ={"SLURM_JOB_ID": "4242"})
    assert "slurm job 4242" in requeue
    assert pre["reason"].endswith(f"stopped after step {pre['step']}; {requeue}"), pre["reason"]
    assert last_event(out)["resume"] == requeue

    again = run(str(tmp_path), str(cfg), "--skip-preflight",
                "--set", f"training.max_steps={pre['step'] + 2}")  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"resuming run {run_dir.name} from step {pre['step']}" in again.stdout
    assert any(e["event"] == "resumed" for e in parse_events(again.stdout))
    finished = outcome(run_dir)
    assert (finished["outcome"], finished["resumed_from"]["step"]) == ("finished", pre["step"])
    previous = json.loads((run_dir / "outcome.previous.json").read_text())
    assert previous["outcome"] == "preempted"


def test_too_short_grace_keeps_the_previous_checkpoint_for_the_next_run(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """stop_grace_s=3 and saves from step 3 on take 35 s: torchrun kills rank 0 mid-save;
    launch exits 143 (cause stopped), the step-2 checkpoint is intact and no temporary file
    is left, and the same command's plan (`--dry-run`) continues this run from it (that a
    plan's resume is what the launch then does is the slow-checkpoint test above)."""
    cfg = make_config(
        training={"max_steps": 100_000, "epochs": 1000},
        checkpoint={"every_steps": 2},
        distributed={"stop_grace_s": 3, "init_timeout_s": 60, "collective_timeout_s": 60},
    )
    log = tmp_path / "runs" / "latest" / "logs" / "launch.log"
    proc = start(str(tmp_path), str(cfg), "--skip-preflight", env={"UPS_FAULTS": "slow_save@0:3"})
    wait_for(log, proc, 240, event="checkpoint_saved", step=2)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=300)
    assert proc.returncode == 143, out[-3000:]
    assert_no_survivors(str(tmp_path))
    run_dir = (tmp_path / "runs" / "latest").resolve()
    stopped = outcome(run_dir)
    assert (stopped["outcome"], stopped["cause"]) == ("failed", "stopped")
    assert stopped["phase"] in ("training", "final_save")
    ckpts = list_checkpoints(run_dir / "checkpoints")
    assert [s for s, _ in ckpts] == [2]
    load_checkpoint(ckpts[0][1])  # verifies its SHA-256
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp" in p.name]

    plan = run(str(tmp_path), str(cfg), "--skip-preflight", "--dry-run")
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-2000:]
    planned = json.loads(plan.stdout)
    assert planned["run_id"] == run_dir.name, planned
    assert planned["resume"] is not None and planned["resume"]["step"] == 2, planned["resume"]
