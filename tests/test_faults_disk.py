"""A full disk: rank 0's failed checkpoint save stops every rank together; preflight's
disk check estimates what the run will write. Real tmpfs mounts."""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import parse_events, torchrun
from tests.fault_helpers import events, strict_json, survivors
from tests.fixtures.preflight_helpers import run_check, small_tmpfs
from ups.distributed.env import read_dist_env
from ups.log import setup_logging
from ups.outcome import EXIT_FAILED, EXIT_SAVE_FAILED, Outcome
from ups.preflight import Status
from ups.train.checkpoint import list_checkpoints, load_checkpoint
from ups.train.run import _finish
from ups.train.tracking import Tracker


@pytest.mark.slow
def test_full_disk_during_a_checkpoint_stops_every_rank_and_resume_works_after(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """The checkpoint disk fills at the third save: both ranks stop at the next step with
    outcome failed naming the path, bytes needed and free and the fix; no temp file is
    left, the two earlier checkpoints verify, and after freeing space the same command
    resumes from the newest one and finishes."""
    run_dir = tmp_path / "runs" / "disk"
    ckpt_dir = run_dir / "checkpoints"
    cfg = make_config(
        run={"run_id": "disk"},
        training={"max_steps": 8},
        checkpoint={"every_steps": 2, "keep_last": 3},
        wandb={"mode": "disabled"},  # W&B (~1.5 CPU-s per start) is not what is checked here
    )
    # A checkpoint of this model is ~95 KB (24 pages of tmpfs) plus a 1-page digest: two fit
    # in 248 KiB, the third does not.
    with small_tmpfs(ckpt_dir, "248k"):
        result = torchrun(cfg)
        assert result.returncode != 0
        outcome = strict_json(run_dir / "outcome.json")
        assert outcome["outcome"] == "failed" and outcome["exit_code"] == EXIT_SAVE_FAILED
        assert outcome["failed_rank"] == 0
        reason = outcome["reason"]
        assert f"writing {ckpt_dir / 'step_000006.pt'}" in reason and "ENOSPC" in reason
        assert "bytes free there" in reason and "it needs " in reason
        assert "lower checkpoint.keep_last" in reason and "run the same command again" in reason
        for rank in (0, 1):  # every rank stopped at the very next step
            assert [e["step"] for e in events(run_dir, rank, "run_failed")] == [6]
        assert any(e.get("event") == "outcome" for e in parse_events(result.stdout))
        assert [p.name for p in ckpt_dir.iterdir() if ".tmp" in p.name] == []
        kept = list_checkpoints(ckpt_dir)
        assert [step for step, _ in kept] == [2, 4]
        for _, path in kept:
            assert load_checkpoint(path)["train_state"]["step"] in (2, 4)
        assert survivors(str(cfg)) == []

        subprocess.run(["mount", "-o", "remount,size=8m", str(ckpt_dir)], check=True)
        again = torchrun(cfg)  # the same command, once space is freed
        assert again.returncode == 0, again.stderr[-3000:]
        resumed = [e for e in parse_events(again.stdout) if e["event"] == "resumed"]
        assert resumed and resumed[0]["step"] == 4
        assert strict_json(run_dir / "outcome.json")["outcome"] == "finished"


@pytest.mark.slow
def test_preflight_disk_fails_when_the_run_will_not_fit(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """A model whose kept checkpoints need more than the disk has fails preflight's disk
    check with the estimate (checkpoint size x keep_last + 1, plus logs); a small model
    on the same disk does not fail."""
    with small_tmpfs(tmp_path / "disk", "3g") as disk:
        big = make_config(
            run={"output_dir": str(disk / "runs")},
            model={"latent_dim": 1024, "depth": 8, "heads": 8, "patch_1d": 8, "patch_2d": 4},
            checkpoint={"every_steps": 100, "keep_last": 3},
        )
        result = run_check("disk", config=big)
        assert result.status is Status.FAIL, result.message
        estimate = result.details["estimate"]
        assert estimate["total"] > 3 * 1024**3
        assert estimate["total"] == 4 * estimate["checkpoint_bytes"] + estimate["log_bytes"]
        assert "the run will write about" in result.message and "4 x" in result.message
        assert result.hint is not None and "checkpoint.keep_last" in result.hint

        small = run_check("disk", config=make_config(run={"output_dir": str(disk / "runs")}))
        assert small.status is not Status.FAIL, small.message


@pytest.mark.slow
def test_bookkeeping_on_a_full_disk_still_reaches_the_console(tmp_path: Path) -> None:
    """With the run directory's disk full to the last byte, the rank's log file and
    outcome.json cannot be written: the trainer does not crash, says so on the console,
    and the outcome itself still reaches the console; no temporary file is left."""

    with small_tmpfs(tmp_path / "full", "64k") as disk:
        run_dir = disk / "run"
        console = io.StringIO()
        setup_logging(rank=0, run_id="full", log_dir=run_dir / "logs", stdout=console)
        filler = (disk / "filler").open("wb", buffering=0)  # unbuffered: close cannot fail
        with filler, contextlib.suppress(OSError):
            while filler.write(b"\0" * 4096):  # until the disk is full to the last block
                pass
        outcome = Outcome(run_id="full", outcome="failed", exit_code=EXIT_FAILED, reason="x")
        _finish(outcome, read_dist_env({}), run_dir, Tracker())
        lines = parse_events(console.getvalue())
        names = [e["event"] for e in lines]
        assert "log_file_unwritable" in names and "outcome_not_written" in names
        assert lines[-1]["event"] == "outcome" and lines[-1]["outcome"] == "failed"
        assert not (run_dir / "outcome.json").exists()
        assert [p.name for p in run_dir.iterdir() if ".tmp" in p.name] == []
