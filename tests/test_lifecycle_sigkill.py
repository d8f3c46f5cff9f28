"""A rank killed by a real SIGKILL: the outcome explains it (OOM killer or not, memory
limit, peak RSS per rank), nothing survives, and the same command resumes bit-exactly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.lifecycle_helpers import final_model, last_event, outcome, run

pytestmark = pytest.mark.slow


def test_sigkilled_rank_is_explained_and_the_same_command_resumes_bit_exactly(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """Rank 1 SIGKILLs itself at step 6 (what the OOM killer or `docker kill` does): exit 1,
    outcome names rank 1 and SIGKILL, says it was not the OOM killer, with the memory limit
    and each rank's peak RSS. Running the same command again says it resumes from step 4,
    and the final weights equal an uninterrupted run's."""
    common = {"training": {"max_steps": 12}, "checkpoint": {"every_steps": 4, "keep_last": 5}}
    ref_cfg = make_config(run={"name": "t", "output_dir": str(tmp_path / "a")}, **common)
    ref = run(str(tmp_path), str(ref_cfg), "--skip-preflight")
    assert ref.returncode == 0, ref.stdout[-3000:]
    reference = final_model((tmp_path / "a" / "latest").resolve())

    cfg = make_config(run={"name": "t", "output_dir": str(tmp_path / "b")}, **common)
    killed = run(str(tmp_path), str(cfg), "--skip-preflight", env={"UPS_FAULTS": "sigkill@1:6"})
    assert killed.returncode == 1, killed.stdout[-3000:]
    run_dir = (tmp_path / "b" / "latest").resolve()
    out = outcome(run_dir)
    assert (out["outcome"], out["failed_rank"], out["signal"]) == ("failed", 1, "SIGKILL")
    assert out["cause"] == "rank_signal" and out["phase"] == "training"
    memory = out["memory"]
    assert memory["oom_killer"] is False, memory
    assert "limit_bytes" in memory and set(memory["peak_rss_bytes"]) == {"0", "1"}
    assert all(v > 50 * 2**20 for v in memory["peak_rss_bytes"].values())  # a torch process
    assert "not the kernel's OOM killer" in out["reason"]
    last = last_event(killed.stdout)
    assert last["outcome"] == "failed" and "run the same command again" in last["resume"]

    resumed = run(str(tmp_path), str(cfg), "--skip-preflight")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resuming run {run_dir.name} from step 4" in resumed.stdout
    assert (tmp_path / "b" / "latest").resolve() == run_dir
    final = outcome(run_dir)
    assert final["outcome"] == "finished" and final["resumed_from"]["step"] == 4
    weights = final_model(run_dir)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), f"{name} differs after resume"
