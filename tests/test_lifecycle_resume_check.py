"""A resume that would change the run's math is refused, unless allowed explicitly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import parse_events
from tests.lifecycle_helpers import (
    FINISHED_RUN_ID,
    finished_config,
    finished_launch,
    last_event,
    outcome,
    run,
)

pytestmark = pytest.mark.slow


def test_resume_on_another_world_size_is_refused_then_allowed(
    tiny_data: dict[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A 2-rank run (a copy of the shared finished run, :func:`finished_launch`: 4 steps,
    run id ws) resumed on 1 rank: refused with exit 2, one paragraph naming the world
    size change and the flag, no traceback. With --allow-resume-change world_size it runs,
    remapping step 4 (global batch 16) to step 8 (global batch 8), and every attempt's
    config is kept."""
    first = finished_launch(tmp_path_factory, tiny_data)
    assert first.returncode == 0, first.stdout[-3000:]
    shutil.copytree(first.output_dir, tmp_path / "runs", symlinks=True)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(finished_config(tmp_path / "runs", tiny_data)))
    run_dir = tmp_path / "runs" / FINISHED_RUN_ID

    args = (str(cfg), "--skip-preflight", "--run-id", FINISHED_RUN_ID, "--nproc-per-node", "1",
            "--set", "training.max_steps=12")  # fmt: skip
    refused = run(str(tmp_path), *args)
    assert refused.returncode == 2, refused.stdout[-3000:]
    out = outcome(run_dir)
    assert (out["outcome"], out["cause"], out["exit_code"]) == ("failed", "config", 2)
    assert "world size 2 -> 1" in out["reason"]
    assert "--allow-resume-change world_size" in out["reason"]
    assert "\n" not in out["reason"]
    assert "Traceback" not in refused.stdout + refused.stderr
    assert "world size 2 -> 1" in last_event(refused.stdout)["reason"]

    allowed = run(str(tmp_path), *args, "--allow-resume-change", "world_size")
    assert allowed.returncode == 0, allowed.stdout[-3000:]
    remap = [e for e in parse_events(allowed.stdout) if e["event"] == "resume_remapped"]
    assert remap and (remap[0]["saved_step"], remap[0]["step"]) == (4, 8)
    assert outcome(run_dir)["outcome"] == "finished"
    kept = sorted(p.name for p in run_dir.glob("config*.yaml"))
    assert kept == ["config.attempt-2.yaml", "config.attempt-3.yaml", "config.yaml"]
    assert "world_size" in (run_dir / "config.attempt-3.yaml").read_text()
