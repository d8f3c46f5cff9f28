"""Rank-local faults that every rank agrees on at the step's fixed points.

Real torchrun workers (gloo, CPU, 2 ranks); the fault comes from the config or is
injected for real at a point inside the step (``UPS_FAULTS=kind@rank:step:point``).

The faults a run survives share one run per kind of agreement (module fixtures, one
worker): every skipped step in one run (an OOM at each point before the all-reduce and
a NaN loss, on separate steps), every repaired update in another; each fault still has
its own test and its own message. The runs that end at their fault have one each, shared
with the tests elsewhere that check the same run (made once per test run): the diverged
launch (tests/lifecycle_helpers.py), the run of consecutive skips (tests/fault_helpers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import only_run_dir, parse_events, tiny_config, torchrun, uninterrupted_run
from tests.fault_helpers import (
    assert_skip_counted,
    consecutive_skips_run,
    events,
    strict_json,
    survivors,
)
from tests.lifecycle_helpers import diverged_launch
from tests.wandb_offline import find_wandb_files, read_offline_run
from ups.outcome import EXIT_FAILED, EXIT_NONFINITE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("faults_agreement"),  # one worker: the shared runs are made once
]


def _digests(run_dir):
    return {rank: events(run_dir, rank, "replica_digest")[-1]["sha256"] for rank in (0, 1)}


@dataclass
class SharedRun:
    run_dir: Path
    config: Path
    returncode: int
    stderr: str


def _shared_run(root: Path, tiny_data, faults: str, **sections) -> SharedRun:
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_config(root / "runs", tiny_data, **sections)))
    result = torchrun(config, env={"UPS_FAULTS": faults})
    return SharedRun(only_run_dir(root / "runs"), config, result.returncode, result.stderr)


SKIPS = {  # step: (where, the fault, the skip's field naming the rank)
    2: ("oom-start", "oom@1:2", "oom_ranks"),
    4: ("oom-forward", "oom@1:4:forward", "oom_ranks"),
    6: ("oom-backward", "oom@1:6:backward", "oom_ranks"),
    8: ("oom-pack", "oom@1:8:pack", "oom_ranks"),
    10: ("nan-loss", "nan@1:10", "nonfinite_ranks"),
}


@pytest.fixture(scope="module")
def skips(tmp_path_factory, tiny_data) -> Iterator[SharedRun]:
    """12 steps with training.nonfinite=skip and every fault of :data:`SKIPS` on rank 1."""
    faults = ",".join(fault for _, fault, _ in SKIPS.values())
    run = _shared_run(
        tmp_path_factory.mktemp("skips"), tiny_data, faults,
        training={"max_steps": 12, "nonfinite": "skip"},
    )  # fmt: skip
    yield run


@pytest.mark.parametrize("step", sorted(SKIPS), ids=[SKIPS[step][0] for step in sorted(SKIPS)])
def test_a_rank_local_fault_before_the_all_reduce_skips_that_step_on_every_rank(skips, step):
    """An OOM on rank 1 at the step's start, in forward, in backward or packing gradients,
    or a NaN loss under training.nonfinite=skip: both ranks skip exactly that step, naming
    rank 1 as the one that ran out of memory (or went non-finite)."""
    assert skips.returncode == 0, skips.stderr[-3000:]
    _, fault, field = SKIPS[step]
    for rank in (0, 1):
        skipped = [e for e in events(skips.run_dir, rank, "step_skipped") if e["step"] == step]
        assert [(e["step"], e.get(field)) for e in skipped] == [(step, [1])], (fault, skipped)


def test_only_the_faulted_steps_are_skipped_and_the_replicas_agree(skips):
    """No other step is skipped; the replicas end equal; the run finishes saying how many
    steps it skipped, W&B records exit 0, and no process is left behind."""
    assert skips.returncode == 0, skips.stderr[-3000:]
    for rank in (0, 1):
        assert [e["step"] for e in events(skips.run_dir, rank, "step_skipped")] == sorted(SKIPS)
    digests = _digests(skips.run_dir)
    assert digests[0] == digests[1]
    outcome = strict_json(skips.run_dir / "outcome.json")
    assert outcome["outcome"] == "finished" and f"{len(SKIPS)} skipped" in outcome["reason"]
    assert read_offline_run(find_wandb_files(skips.run_dir)[0]).exit_code == 0
    assert survivors(str(skips.config)) == []


REPAIRS = {"clip": 2, "optimizer": 5, "scheduler": 8}
"""Where rank 1 runs out of memory inside the update, and at which step."""


@pytest.fixture(scope="module")
def repairs(tmp_path_factory, tiny_data) -> Iterator[SharedRun]:
    """12 steps with an OOM on rank 1 at each point of :data:`REPAIRS`."""
    faults = ",".join(f"oom@1:{step}:{point}" for point, step in REPAIRS.items())
    yield _shared_run(tmp_path_factory.mktemp("repairs"), tiny_data, faults,
                      training={"max_steps": 12})  # fmt: skip


@pytest.mark.parametrize("point", sorted(REPAIRS))
def test_oom_in_the_update_is_repaired_from_a_rank_that_completed_it(repairs, point):
    """OOM on rank 1 in clipping, the optimizer or the scheduler: rank 0's update is copied
    to rank 1 at the second agreement, and that step is not skipped."""
    assert repairs.returncode == 0, repairs.stderr[-3000:]
    step = REPAIRS[point]
    for rank in (0, 1):
        repaired = [
            e for e in events(repairs.run_dir, rank, "update_repaired") if e["step"] == step
        ]
        assert [(e["step"], e["oom_ranks"], e["source_rank"]) for e in repaired] == [(step, [1], 0)]
        assert not events(repairs.run_dir, rank, "step_skipped")


def test_repaired_updates_end_with_a_clean_runs_weights(repairs, tmp_path_factory):
    """After every repair the run finishes with both replicas equal to an uninterrupted
    run's (the same config without faults), and no process is left behind."""
    assert repairs.returncode == 0, repairs.stderr[-3000:]
    clean = _digests(uninterrupted_run(tmp_path_factory, repairs.config))[0]
    assert _digests(repairs.run_dir) == {0: clean, 1: clean}
    assert strict_json(repairs.run_dir / "outcome.json")["outcome"] == "finished"
    assert survivors(str(repairs.config)) == []


def test_diverging_learning_rate_fails_every_rank_at_the_same_step(tiny_data, tmp_path_factory):
    """--set training.lr=1e6: the run fails (not "finished") naming the step, ranks, losses,
    fix. The run is the shared diverged launch (:func:`diverged_launch`, through `ups
    launch`, whose exit code and plan tests/test_lifecycle_restart.py checks)."""
    result = diverged_launch(tmp_path_factory, tiny_data)
    assert result.returncode != 0
    run_dir = only_run_dir(result.output_dir)
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
    assert result.survivors == []


def test_nonfinite_skips_count_against_the_consecutive_limit(tiny_data, tmp_path_factory):
    """A NaN skip counts toward training.max_consecutive_skips=2: in the shared run
    (:func:`consecutive_skips_run`) rank 0's NaN at step 3 is the second skip in a row, so
    the run fails, naming the limit and the fix."""
    result = consecutive_skips_run(tmp_path_factory, tiny_data)
    assert_skip_counted(result, 3)
    assert result.returncode != 0, "two skips in a row did not fail the run"
    outcome = strict_json(only_run_dir(result.output_dir) / "outcome.json")
    assert outcome["outcome"] == "failed" and outcome["exit_code"] == EXIT_FAILED
    assert "max_consecutive_skips=2" in outcome["reason"] and "training.lr" in outcome["reason"]
    assert result.survivors == []


def test_oom_inside_the_optimizer_on_every_rank_fails_clearly(make_config, tmp_path):
    """Every rank runs out of memory inside the optimizer step: no good replica, so failed."""
    cfg = make_config(training={"max_steps": 8})
    result = torchrun(cfg, env={"UPS_FAULTS": "oom@0:3:optimizer,oom@1:3:optimizer"})
    assert result.returncode != 0
    outcome = strict_json(only_run_dir(tmp_path / "runs") / "outcome.json")
    assert outcome["outcome"] == "failed" and outcome["step"] == 3
    assert "inside the optimizer step on every rank at step 3" in outcome["reason"]
    assert survivors(str(cfg)) == []
