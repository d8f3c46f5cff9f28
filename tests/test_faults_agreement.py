"""Rank-local faults that every rank agrees on at the step's fixed points.

Real torchrun workers (gloo, CPU, 2 ranks); the fault comes from the config or is
injected for real at a point inside the step (``UPS_FAULTS=kind@rank:step:point``).
"""

from __future__ import annotations

import pytest

from tests.conftest import only_run_dir, parse_events, torchrun
from tests.fault_helpers import events, strict_json, survivors
from tests.wandb_offline import find_wandb_files, read_offline_run
from ups.outcome import EXIT_FAILED, EXIT_NONFINITE

pytestmark = pytest.mark.slow


def _digests(run_dir):
    return {rank: events(run_dir, rank, "replica_digest")[-1]["sha256"] for rank in (0, 1)}


def test_diverging_learning_rate_fails_every_rank_at_the_same_step(make_config, tmp_path):
    """--set training.lr=1e6: the run fails (not "finished") naming the step, ranks, losses, fix."""
    cfg = make_config(training={"max_steps": 40})
    result = torchrun(cfg, "--set", "training.lr=1e6")
    assert result.returncode != 0
    run_dir = only_run_dir(tmp_path / "runs")
    outcome = strict_json(run_dir / "outcome.json")  # strict: a bare NaN would raise
    assert outcome["outcome"] == "failed" and outcome["exit_code"] == EXIT_NONFINITE
    reason = outcome["reason"]
    step = outcome["step"]
    # Which overflows first at lr=1e6, the loss or only its gradient, depends on the
    # floating-point path (thread count, load-free kernels); both are the same agreement.
    kind = "loss" if f"non-finite loss at step {step}" in reason else "gradient"
    assert f"non-finite {kind} at step {step} on rank(s) [" in reason, reason
    assert "advection=" in reason and "darcy=" in reason
    if kind == "loss":
        assert "nan" in reason.lower() or "inf" in reason.lower()
    assert "lower training.lr (now 1e+06)" in reason and "training.grad_clip" in reason
    for rank in (0, 1):  # every rank stopped at that step, cleanly (no traceback)
        failed = events(run_dir, rank, "run_failed")
        assert [e["step"] for e in failed] == [step]
        assert not events(run_dir, rank, "rank_failed")
        # no update was applied at or after the failing step
        assert all(e["step"] < step for e in events(run_dir, rank, "train_step"))
    assert all(e.get("outcome") != "finished" for e in parse_events(result.stdout))
    assert read_offline_run(find_wandb_files(run_dir)[0]).exit_code == EXIT_NONFINITE
    assert survivors(str(cfg)) == []


def test_nonfinite_skip_policy_skips_that_step_on_every_rank(make_config, tmp_path):
    """training.nonfinite=skip and a NaN loss on rank 1 at step 3: both ranks skip it, finish."""
    cfg = make_config(training={"max_steps": 8, "nonfinite": "skip"})
    result = torchrun(cfg, env={"UPS_FAULTS": "nan@1:3"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    for rank in (0, 1):
        skipped = events(run_dir, rank, "step_skipped")
        assert [(e["step"], e["nonfinite_ranks"]) for e in skipped] == [(3, [1])]
    digests = _digests(run_dir)
    assert digests[0] == digests[1]
    outcome = strict_json(run_dir / "outcome.json")
    assert outcome["outcome"] == "finished" and "1 skipped" in outcome["reason"]


def test_nonfinite_skips_count_against_the_consecutive_limit(make_config, tmp_path):
    """Two NaN steps in a row with max_consecutive_skips=2: failed, naming the limit and the fix."""
    cfg = make_config(training={"max_steps": 10, "nonfinite": "skip", "max_consecutive_skips": 2})
    result = torchrun(cfg, env={"UPS_FAULTS": "nan@1:2,nan@0:3"})
    assert result.returncode != 0
    outcome = strict_json(only_run_dir(tmp_path / "runs") / "outcome.json")
    assert outcome["outcome"] == "failed" and outcome["exit_code"] == EXIT_FAILED
    assert "max_consecutive_skips=2" in outcome["reason"] and "training.lr" in outcome["reason"]
    assert survivors(str(cfg)) == []


@pytest.mark.parametrize("point", ["forward", "backward", "pack"])
def test_oom_before_the_all_reduce_skips_the_step_on_every_rank(make_config, tmp_path, point):
    """OOM on rank 1 in forward, backward or packing gradients: both ranks skip step 3, finish."""
    cfg = make_config(training={"max_steps": 8})
    result = torchrun(cfg, env={"UPS_FAULTS": f"oom@1:3:{point}"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    for rank in (0, 1):
        skipped = events(run_dir, rank, "step_skipped")
        assert [(e["step"], e["oom_ranks"]) for e in skipped] == [(3, [1])]
    digests = _digests(run_dir)
    assert digests[0] == digests[1]
    assert strict_json(run_dir / "outcome.json")["outcome"] == "finished"
    assert survivors(str(cfg)) == []


@pytest.mark.parametrize("point", ["clip", "optimizer", "scheduler"])
def test_oom_in_the_update_is_repaired_from_a_rank_that_completed_it(make_config, tmp_path, point):
    """OOM on rank 1 in clipping, the optimizer or the scheduler: rank 0's update is copied to
    rank 1 at the second agreement, the run finishes, and the weights equal a clean run's."""
    clean_cfg = make_config(training={"max_steps": 8}, run={"output_dir": str(tmp_path / "a")})
    assert torchrun(clean_cfg).returncode == 0
    clean = _digests(only_run_dir(tmp_path / "a"))[0]

    cfg = make_config(training={"max_steps": 8}, run={"output_dir": str(tmp_path / "b")})
    result = torchrun(cfg, env={"UPS_FAULTS": f"oom@1:3:{point}"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "b")
    for rank in (0, 1):
        repaired = events(run_dir, rank, "update_repaired")
        assert [(e["step"], e["oom_ranks"], e["source_rank"]) for e in repaired] == [(3, [1], 0)]
        assert not events(run_dir, rank, "step_skipped")
    assert _digests(run_dir) == {0: clean, 1: clean}
    assert strict_json(run_dir / "outcome.json")["outcome"] == "finished"
    assert survivors(str(cfg)) == []


def test_oom_inside_the_optimizer_on_every_rank_fails_clearly(make_config, tmp_path):
    """Every rank runs out of memory inside the optimizer step: no good replica, so failed."""
    cfg = make_config(training={"max_steps": 8})
    result = torchrun(cfg, env={"UPS_FAULTS": "oom@0:3:optimizer,oom@1:3:optimizer"})
    assert result.returncode != 0
    outcome = strict_json(only_run_dir(tmp_path / "runs") / "outcome.json")
    assert outcome["outcome"] == "failed" and outcome["step"] == 3
    assert "inside the optimizer step on every rank at step 3" in outcome["reason"]
    assert survivors(str(cfg)) == []
