"""training.strategy: fsdp: FSDP2 over 2 real gloo ranks with DDP's guarantees,
sharded checkpoints that are complete or absent, and `ups checkpoint export`."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import (
    PYTHON,
    REPO,
    only_run_dir,
    parse_events,
    rank_events,
    torchrun,
    uninterrupted_run,
)
from ups.config.schema import CheckpointConfig
from ups.outcome import EXIT_CONFIG, EXIT_PREEMPTED, read_outcome
from ups.train.checkpoint import CheckpointSaveFailed
from ups.train.export import export_weights
from ups.train.resume import ResumeRefused, check_resume
from ups.train.sharded import MANIFEST, latest_good_sharded, list_sharded, save_sharded

STEPS = 8
# Rank 1 OOMs at the start of step 3, rank 0 inside step 5's backward (FSDP's hooks
# mid-flight): both steps are skipped on every rank, under either strategy.
OOMS = [{"kind": "oom", "rank": 1, "step": 3},
        {"kind": "oom", "rank": 0, "step": 5, "point": "backward"}]  # fmt: skip


def _shared(strategy: str) -> dict[str, Any]:
    """The config of the module's two shared runs (one per strategy, made once per test run
    by conftest.uninterrupted_run): accumulation, bf16 and the two OOMs together, a sharded
    checkpoint every 2 steps. The OOM test checks the skips, the shards and the error band
    on them, the bf16 test the weights, and the SIGTERM test resumes this fsdp config (its
    faults included) to the shared fsdp run's weights. Launching each once instead of once
    per test is what keeps this module's CPU down (each launch is ~12 CPU-s of imports)."""
    training = {"max_steps": STEPS, "strategy": strategy, "accum_steps": 2, "precision": "bf16",
                "batch_size": 4}  # fmt: skip
    return {"training": training, "checkpoint": {"every_steps": 2}, "faults": OOMS}


def _events(run_dir: Path, rank: int, name: str) -> list[dict]:
    return [e for e in rank_events(run_dir, rank) if e["event"] == name]


def _eval(run_dir: Path) -> dict[str, float]:
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "finished", outcome
    return {k: v for k, v in outcome.metrics.items() if k.endswith("/rel_l2")}


def _export(run_dir: Path) -> dict:
    proc = subprocess.run(
        [PYTHON, "-m", "ups", "checkpoint", "export", str(run_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (written,) = [e["path"] for e in parse_events(proc.stdout) if e["event"] == "exported"]
    exported: dict = torch.load(written, weights_only=True)  # the point of the export
    return exported


@pytest.mark.slow
def test_fsdp_skips_an_oom_on_every_rank_and_ends_in_ddps_error_band(
    make_config: Callable[..., Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Under fsdp (with accumulation and bf16), an OOM on rank 1 at the start of step 3 and
    on rank 0 inside step 5's backward (FSDP's hooks mid-flight) skip exactly those steps on
    both ranks without a hang; the shards end equal across ranks, only keep_last sharded
    checkpoints remain (no temporary directory), and the held-out error is in the band of a
    DDP run with the same faults (both are the module's shared runs, :func:`_shared`).
    Resuming (a copy of) that DDP run under fsdp is refused (exit 2) naming the strategy.
    An OOM inside rank 1's optimizer step (rank 0 completed its shard's update) stops both
    ranks at that step with cause oom_in_step and the reason, never a hang."""
    runs = {
        s: uninterrupted_run(tmp_path_factory, make_config(**_shared(s))) for s in ("ddp", "fsdp")
    }
    run_dir = runs["fsdp"]
    for rank in (0, 1):
        skipped = _events(run_dir, rank, "step_skipped")
        assert [(e["step"], e["oom_ranks"]) for e in skipped] == [(3, [1]), (5, [0])], rank
    digests = {_events(run_dir, rank, "replica_digest")[-1]["sha256"] for rank in (0, 1)}
    assert len(digests) == 1, "the fsdp ranks' shards differ at the end"
    ckpts = run_dir / "checkpoints"
    # Saved every 2 steps; keep_last is its default (uninterrupted_run leaves it out of the
    # config: it changes nothing computed), so the older ones were pruned.
    kept = list(range(2, STEPS + 1, 2))[-CheckpointConfig().keep_last :]
    assert len(kept) < STEPS // 2, "nothing to prune: keep_last's default grew"
    assert [s for s, _ in list_sharded(ckpts)] == kept
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step_{s:06d}.dcp" for s in kept]
    assert json.loads((ckpts / "step_000008.dcp" / MANIFEST).read_text())["files"]
    fsdp, ddp = _eval(runs["fsdp"]), _eval(runs["ddp"])
    assert fsdp.keys() == ddp.keys() and fsdp
    for key, value in ddp.items():
        assert abs(fsdp[key] - value) <= 0.05 * value, (key, fsdp[key], value)

    # The shared DDP run stays as it is for the other tests: the refusal writes its
    # outcome into a copy.
    copied = tmp_path / "switched" / runs["ddp"].name
    shutil.copytree(runs["ddp"], copied, symlinks=True)
    switched = make_config(**_shared("fsdp"), run={"output_dir": str(copied.parent)},
                           wandb={"mode": "disabled"})  # fmt: skip
    result = torchrun(switched, env={"UPS_RUN_ID": copied.name})
    assert result.returncode != 0
    refused = read_outcome(copied)
    assert refused is not None and (refused.exit_code, refused.cause) == (EXIT_CONFIG, "config")
    assert "training.strategy=ddp" in refused.reason and "--fresh" in refused.reason

    partial = make_config(
        training={"max_steps": 8, "strategy": "fsdp"},
        run={"output_dir": str(tmp_path / "partial")},
        wandb={"mode": "disabled"},
    )
    result = torchrun(partial, env={"UPS_FAULTS": "oom@1:2:optimizer"})
    assert result.returncode != 0
    failed = read_outcome(only_run_dir(tmp_path / "partial"))
    assert failed is not None and (failed.cause, failed.step) == ("oom_in_step", 2)
    assert "only copy of its shard" in failed.reason


@pytest.mark.slow
def test_sigterm_sharded_checkpoint_resumes_to_the_uninterrupted_weights(
    make_config: Callable[..., Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """SIGTERM at step 4 under fsdp (with accumulation, bf16 and the skipped OOM steps, the
    options it composes with): outcome preempted with a sharded checkpoint; the same command
    on 1 rank is refused (exit 2, the world size named), on 2 ranks it resumes, and `ups
    checkpoint export` of both runs gives one weights_only file whose weights equal an
    uninterrupted fsdp run's exactly (the module's shared fsdp run, :func:`_shared`)."""
    written, _, _ = export_weights(  # in process; the CLI below
        uninterrupted_run(tmp_path_factory, make_config(**_shared("fsdp"))),
        tmp_path / "reference.pt",
    )
    reference = torch.load(written, weights_only=True)

    cfg = make_config(**_shared("fsdp"), run={"output_dir": str(tmp_path / "b")},
                      wandb={"mode": "disabled"})  # fmt: skip
    first = torchrun(cfg, env={"UPS_FAULTS": "sigterm@0:4"})
    assert first.returncode != 0
    run_dir = only_run_dir(tmp_path / "b")
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "preempted", outcome
    assert outcome.exit_code == EXIT_PREEMPTED
    # torchrun forwards the SIGTERM asynchronously: the stop step is read, not assumed.
    assert 4 <= outcome.step < STEPS, outcome.step
    assert outcome.checkpoint is not None and outcome.checkpoint.endswith(".dcp")
    assert (Path(outcome.checkpoint) / MANIFEST).is_file()

    second = torchrun(cfg)  # the same command again
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = [e for e in parse_events(second.stdout) if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == outcome.step
    final = _export(run_dir)
    assert (final["strategy"], final["step"]) == ("fsdp", STEPS)
    assert (reference["strategy"], reference["step"]) == ("fsdp", STEPS)
    assert final["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), f"{name} differs after resume"

    narrower = torchrun(cfg, nproc=1, env={"UPS_RUN_ID": run_dir.name})
    assert narrower.returncode != 0
    refused = read_outcome(run_dir)
    assert refused is not None and (refused.exit_code, refused.cause) == (EXIT_CONFIG, "config")
    assert "world size 2 -> 1" in refused.reason and "fsdp" in refused.reason


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process on purpose
def test_a_sharded_checkpoint_is_complete_or_skipped(tmp_path: Path) -> None:
    """One process, real DCP: keep_last prunes older directories and a stale temporary
    one; a shard modified after the save makes resume skip that checkpoint for the older
    good one; a directory without a manifest is never trusted; a save that cannot write
    raises CheckpointSaveFailed naming the checkpoint and the fix."""
    ckpts = tmp_path / "checkpoints"
    stale = ckpts / ".step_000001.dcp.tmp"
    stale.mkdir(parents=True)
    for step in (2, 4, 6):
        shards = {"model": {"w": torch.full((4, 3), float(step))}}
        meta = {"train_state": {"step": step}}
        save_sharded(ckpts, step, shards, meta, keep_last=2, is_rank0=True)
    assert [s for s, _ in list_sharded(ckpts)] == [4, 6]
    assert not stale.exists()
    found = latest_good_sharded(ckpts)
    assert found is not None and found[1]["train_state"]["step"] == 6

    shard = next((ckpts / "step_000006.dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    found = latest_good_sharded(ckpts)
    assert found is not None and found[0].name == "step_000004.dcp"

    (ckpts / "step_000004.dcp" / MANIFEST).unlink()
    assert latest_good_sharded(ckpts) is None

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the checkpoint directory should be")
    with pytest.raises(CheckpointSaveFailed) as err:
        save_sharded(blocked, 8, {"model": {"w": torch.ones(2)}}, {}, keep_last=2, is_rank0=True)
    assert "step_000008.dcp" in err.value.reason() and "Fix:" in err.value.reason()


@pytest.mark.slow
def test_export_names_what_is_wrong(tmp_path: Path) -> None:
    """`ups checkpoint export` on a directory that is not a run exits 2 and says what to
    pass; on a run without a good checkpoint it exits 1 naming the directory."""
    proc = subprocess.run(
        [PYTHON, "-m", "ups", "checkpoint", "export", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == EXIT_CONFIG
    assert "is not a run directory" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "checkpoints").mkdir()
    proc = subprocess.run(
        [PYTHON, "-m", "ups", "checkpoint", "export", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "no checkpoint that verifies" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_refuses_another_strategy_and_an_fsdp_world_size_change() -> None:
    """A ddp checkpoint resumed as fsdp is refused even with every change allowed; under
    fsdp a world size change is refused although --allow-resume-change world_size was
    given, and the refusal says why instead of suggesting that flag."""
    ddp = {"strategy": "ddp", "world_size": 2, "batch_size": 8, "global_batch": 16,
           "config": {"seed": 0}, "torch": "2.13.0", "data": {}}  # fmt: skip
    every = ["world_size", "batch", "config", "torch", "data"]
    with pytest.raises(ResumeRefused, match=r"training\.strategy ddp -> fsdp"):
        check_resume(ddp, {**ddp, "strategy": "fsdp"}, every, "ckpt")
    fsdp = {**ddp, "strategy": "fsdp"}
    with pytest.raises(ResumeRefused) as err:
        check_resume(fsdp, {**fsdp, "world_size": 4, "global_batch": 32}, every, "ckpt")
    assert "world size 2 -> 4" in str(err.value) and "cannot change" in str(err.value)
    assert "--allow-resume-change" not in str(err.value)
    assert check_resume(ddp, {**ddp, "world_size": 4, "global_batch": 32}, every, "ckpt")


@pytest.mark.slow
def test_fsdp_with_accumulation_and_bf16_matches_ddp(
    make_config: Callable[..., Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The strategy and the step's other options compose: fsdp with accum_steps 2 and bf16
    autocast trains (the outcome records them) and ends with the same weights as DDP with
    the same options and the same skipped OOM steps (both reduce the same flat gradient),
    up to bf16 rounding. Both are the module's shared runs (:func:`_shared`); the fsdp one
    is the SIGTERM test's reference."""
    weights = {}
    for strategy in ("ddp", "fsdp"):
        run_dir = uninterrupted_run(tmp_path_factory, make_config(**_shared(strategy)))
        outcome = read_outcome(run_dir)
        assert outcome is not None and outcome.outcome == "finished", outcome
        assert outcome.training is not None
        facts = outcome.training
        assert (facts["strategy"], facts["precision"], facts["accum_steps"]) == (
            strategy,
            "bf16",
            2,
        )
        # in process (the CLI's is tested above), written here: the run is shared
        written, _, _ = export_weights(run_dir, tmp_path / f"{strategy}.pt")
        weights[strategy] = torch.load(written, weights_only=True)["model"]
    assert weights["ddp"].keys() == weights["fsdp"].keys()
    for name, ddp in weights["ddp"].items():
        torch.testing.assert_close(weights["fsdp"][name], ddp, rtol=1e-2, atol=1e-3, msg=name)


@pytest.mark.parametrize(
    ("option", "named"),
    [({"oom_policy": "fail"}, "oom_policy=fail"), ({"compile": True}, "compile=true"),
     ({"precision": "fp16"}, "precision=fp16")],
)  # fmt: skip
def test_fsdp_refuses_the_options_it_was_not_built_with(option: dict, named: str) -> None:
    """fsdp with oom_policy fail, compile or fp16 is a config error naming the option and
    what to use instead, not an untested run."""
    from pydantic import ValidationError

    from ups.config.schema import TrainingConfig

    with pytest.raises(ValidationError) as raised:
        TrainingConfig.model_validate({"strategy": "fsdp", **option})
    text = str(raised.value)
    assert f"training.{named}" in text and "strategy=ddp" in text, text
    TrainingConfig.model_validate({"strategy": "ddp", **option})  # fine under ddp
