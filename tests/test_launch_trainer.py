"""`ups launch CONFIG` with the bundled trainer: finish, and a segfault named. SIGTERM to
`ups launch` (preempted, exit 75, resume) is tests/test_lifecycle_preempt.py's first test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch_helpers import outcome_of
from tests.lifecycle_helpers import (
    FINISHED_RUN_ID,
    SEGFAULT_RUN_ID,
    finished_launch,
    segfaulted_launch,
)

pytestmark = pytest.mark.slow


def test_trainer_finishes_through_launch(
    tiny_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`ups launch CONFIG` runs the trainer on 2 ranks (the shared finished run,
    :func:`finished_launch`): exit 0, outcome finished with the step count,
    per-rank logs and a checkpoint in the run dir, `latest` pointing at it, nothing left
    running."""
    launched = finished_launch(tmp_path_factory, tiny_data)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-2000:]
    assert launched.survivors == [], f"processes outlived ups launch: {launched.survivors}"
    run_dir = (launched.output_dir / "latest").resolve()
    assert run_dir == launched.output_dir / FINISHED_RUN_ID
    outcome = outcome_of(run_dir)
    assert (outcome["outcome"], outcome["step"], outcome["world_size"]) == ("finished", 4, 2)
    assert {p.name for p in (run_dir / "logs").iterdir()} >= {
        "launch.log", "rank0.jsonl", "rank1.jsonl",
    }  # fmt: skip
    assert list((run_dir / "checkpoints").glob("step_*.pt"))


def test_trainer_segfault_names_rank_and_signal(
    tiny_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """An injected segfault on rank 1 of the real trainer (the shared run,
    :func:`segfaulted_launch`): launch exits 1 and outcome.json names rank 1 and SIGSEGV,
    with rank 1's log (holding the faulthandler stack) to read."""
    launched = segfaulted_launch(tmp_path_factory, tiny_data)
    assert launched.returncode == 1, launched.stdout[-3000:]
    outcome = outcome_of(launched.output_dir / SEGFAULT_RUN_ID)
    assert (outcome["outcome"], outcome["failed_rank"], outcome["signal"]) == (
        "failed", 1, "SIGSEGV",
    )  # fmt: skip
    assert "rank 1 died with SIGSEGV" in outcome["reason"]
    assert "Segmentation fault" in Path(outcome["traceback"]).read_text()
