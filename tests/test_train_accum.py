"""Gradient accumulation and the out-of-memory policy.

Real torchrun workers (gloo, CPU, 2 ranks) on the tiny two-task data. Three short runs
share one module fixture: one batch of 32 per step, and 4 micro-batches of 8 per step
under each ``oom_policy``; the loader hands both the same 32 samples per task per step
(the step batch), so after a few steps the weights must agree to rounding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.conftest import only_run_dir, torchrun
from tests.fault_helpers import events, strict_json, survivors
from ups.train.checkpoint import load_checkpoint
from ups.train.resume import ResumeRefused, check_resume, remapped_step

pytestmark = pytest.mark.xdist_group("train_accum")  # one worker: the three runs are shared

STEPS = 4
SAVED = 3
"""``checkpoint.every_steps``: every run saves after step 2, before the step a fault hits."""


@dataclass
class Run:
    returncode: int
    stderr: str
    seconds: float
    run_dir: Path
    config: Path


def _config(root: Path, data: dict[str, Path], **training: Any) -> Path:
    cfg = {
        "run": {"name": "acc", "output_dir": str(root / "runs"), "seed": 0},
        "tasks": [
            {"name": "advection", "layout": "single_1d", "path": str(data["advection"])},
            {"name": "darcy", "layout": "darcy_2d", "path": str(data["darcy"])},
        ],
        "model": {"latent_dim": 16, "depth": 1, "heads": 2, "patch_1d": 8, "patch_2d": 4},
        "training": {"max_steps": STEPS, "log_every": 1, "lr": 3e-3, "warmup_steps": 1,
                     "schedule": "constant", "record_sample_ids": True, **training},
        "checkpoint": {"every_steps": SAVED, "keep_last": 5},
        "distributed": {"init_timeout_s": 60, "collective_timeout_s": 30},
        "wandb": {"mode": "disabled"},
    }  # fmt: skip
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> dict[str, Run]:
    """one: batch 32; accum: 4 x 8 with rank 1 out of memory after the backward of all its
    micro-batches of step 3 (skip); fail: 4 x 8 under oom_policy fail, rank 1 out of memory
    in step 3's backward."""
    out = {}
    for name, faults, training in [
        ("one", "", {"batch_size": 32}),
        ("accum", "oom@1:3:pack", {"batch_size": 8, "accum_steps": 4}),
        ("fail", "oom@1:3:backward", {"batch_size": 8, "accum_steps": 4, "oom_policy": "fail"}),
    ]:
        root = tmp_path_factory.mktemp(name)
        config = _config(root, tiny_data, **training)
        started = time.monotonic()
        result = torchrun(config, env={"UPS_FAULTS": faults} if faults else None)
        seconds = time.monotonic() - started
        out[name] = Run(
            result.returncode, result.stderr, seconds, only_run_dir(root / "runs"), config
        )
    return out


def _weights(run: Run, step: int) -> dict[str, torch.Tensor]:
    state = load_checkpoint(run.run_dir / "checkpoints" / f"step_{step:06d}.pt")
    weights: dict[str, torch.Tensor] = state["model"]
    return weights


def _ids(run: Run, rank: int) -> dict[int, Any]:
    return {e["step"]: e["ids"] for e in events(run.run_dir, rank, "batch_ids")}


@pytest.mark.slow
def test_four_micro_batches_of_8_match_one_batch_of_32(runs: dict[str, Run]) -> None:
    """Same samples per optimizer step (the ids each rank logged are equal step by step),
    and after 3 steps the weights of ``accum_steps: 4, batch_size: 8`` equal those of
    ``batch_size: 32`` to float rounding, under both OOM policies; the logged samples/s
    counts all 4 micro-batches."""
    one, accum, fail = runs["one"], runs["accum"], runs["fail"]
    assert one.returncode == 0, one.stderr[-3000:]
    for rank in (0, 1):
        assert _ids(accum, rank) == _ids(fail, rank) == _ids(one, rank)
        assert [len(_ids(accum, rank)[s]["advection"]) for s in range(STEPS)] == [32, 32, 32, 14]
    reference = _weights(one, SAVED)
    for run in (accum, fail):
        weights = _weights(run, SAVED)
        assert weights.keys() == reference.keys()
        for key, value in reference.items():
            assert torch.allclose(weights[key], value, rtol=1e-4, atol=1e-6), (run.run_dir, key)
    start = next(e for e in events(accum.run_dir, 0, "train_start"))
    assert (start["accum_steps"], start["oom_policy"]) == (4, "skip")
    steps = events(accum.run_dir, 0, "train_step")
    assert all(e["train/samples_per_s"] > 0 for e in steps)


@pytest.mark.slow
def test_a_skipped_step_skips_all_micro_batches_on_both_ranks(runs: dict[str, Run]) -> None:
    """Rank 1 runs out of memory after the backward of all 4 micro-batches of step 3: both
    ranks skip step 3, no update from any of its micro-batches is applied (the weights
    after it are bit-identical to those before), the replicas agree, the run finishes."""
    run = runs["accum"]
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        skipped = events(run.run_dir, rank, "step_skipped")
        assert [(e["step"], e["oom_ranks"]) for e in skipped] == [(3, [1])]
    assert [e["step"] for e in events(run.run_dir, 0, "train_step")] == [0, 1, 2]
    before, after = _weights(run, SAVED), _weights(run, STEPS)
    assert all(torch.equal(before[k], after[k]) for k in before)
    digests = {r: events(run.run_dir, r, "replica_digest")[-1]["sha256"] for r in (0, 1)}
    assert digests[0] == digests[1]
    outcome = strict_json(run.run_dir / "outcome.json")
    assert outcome["outcome"] == "finished" and "1 skipped" in outcome["reason"]
    assert outcome["training"]["accum_steps"] == 4


@pytest.mark.slow
def test_oom_policy_fail_ends_the_run_naming_the_rank_and_the_fix(runs: dict[str, Run]) -> None:
    """``oom_policy: fail``: DDP's own overlapped all-reduce, no skip. Rank 1 out of memory
    in step 3's backward ends the run on every rank promptly (no hang until a timeout):
    outcome failed, rank 1 and the fix named, nothing skipped, no process left behind."""
    run = runs["fail"]
    assert run.returncode != 0
    assert run.seconds < 120, f"took {run.seconds:.0f}s"
    outcome = strict_json(run.run_dir / "outcome.json")
    assert outcome["outcome"] == "failed" and outcome["failed_rank"] == 1, outcome
    assert "oom_policy=fail" in outcome["reason"] and "batch_size" in outcome["reason"]
    assert outcome["training"]["oom_policy"] == "fail"
    for rank in (0, 1):
        assert not events(run.run_dir, rank, "step_skipped")
    assert survivors(str(run.config)) == []


def test_a_changed_accum_steps_is_refused_like_a_changed_batch() -> None:
    """Resuming with another ``accum_steps`` changes the samples per step: refused under
    the ``batch`` group; allowed, the step is remapped to the same samples seen."""
    saved = {"world_size": 2, "batch_size": 8, "accum_steps": 4, "global_batch": 64,
             "config": {}, "torch": "2.13.0", "data": {}}  # fmt: skip
    now = json.loads(json.dumps(saved)) | {"accum_steps": 1, "global_batch": 16}
    with pytest.raises(
        ResumeRefused, match=r"accumulation steps 4 -> 1.*allow-resume-change batch"
    ):
        check_resume(saved, now, [], "ckpt.pt")
    assert check_resume(saved, now, ["batch"], "ckpt.pt") == ["accumulation steps 4 -> 1"]
    assert remapped_step(10, saved, now) == 40
