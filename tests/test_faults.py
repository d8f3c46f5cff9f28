"""The fault matrix: each fault injected into real torchrun workers (gloo, CPU).

The tests that start from a preempted run share one (:func:`tests.fault_helpers.preempted_run`,
made once per test run); each that resumes it works on its own copy. A run that other
modules check too is shared with them: the consecutive skips (tests/fault_helpers.py), the
crash by an exception and the SIGSEGV (tests/lifecycle_helpers.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import (
    Finished,
    only_run_dir,
    parse_events,
    rank_events,
    torchrun,
    uninterrupted_run,
)
from tests.fault_helpers import (
    PREEMPTED_AT,
    assert_skip_counted,
    consecutive_skips_run,
    copy_of,
    preempted_config,
    preempted_run,
    survivors,
)
from tests.lifecycle_helpers import crashed_launch, segfaulted_launch
from tests.wandb_offline import find_wandb_files, read_offline_run
from ups.outcome import EXIT_PREEMPTED, read_outcome
from ups.train.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.slow


def _events(run_dir: Path, rank: int, name: str) -> list[dict]:
    return [e for e in rank_events(run_dir, rank) if e["event"] == name]


def _wandb_exit_code(run_dir: Path) -> int | None:
    files = find_wandb_files(run_dir)
    assert len(files) == 1, f"expected rank 0's single offline W&B run, found {files}"
    return read_offline_run(files[0]).exit_code


def _assert_no_finished(run_dir: Path, stdout: str) -> None:
    for rank in (0, 1):
        outcomes = _events(run_dir, rank, "outcome")
        assert all(e["outcome"] != "finished" for e in outcomes)
    assert all(e.get("outcome") != "finished" for e in parse_events(stdout))


def test_too_many_consecutive_skips_fails_clearly(tiny_data, tmp_path_factory):
    """An OOM skip counts toward training.max_consecutive_skips: in the shared run
    (:func:`consecutive_skips_run`) rank 1's OOM at step 2 is the first of two skips in a
    row, and the run then fails on every rank at the limit."""
    result = consecutive_skips_run(tmp_path_factory, tiny_data)
    assert_skip_counted(result, 2)
    assert result.returncode != 0, "two skips in a row did not fail the run"
    run_dir = only_run_dir(result.output_dir)
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "failed"
    assert "max_consecutive_skips=2" in outcome.reason
    _assert_no_finished(run_dir, result.stdout)
    assert _wandb_exit_code(run_dir) == 1


def _crashed(kind: str, tiny_data, tmp_path_factory):
    """How a run with rank 1's ``kind`` crash ended: both are launches shared with other
    modules, `ups launch` of the trainer: the exception :func:`crashed_launch` (with
    ``--max-restarts 2``, which never restarts a deterministic failure), the real SIGSEGV
    :func:`segfaulted_launch`."""
    make = crashed_launch if kind == "exception" else segfaulted_launch
    crashed = make(tmp_path_factory, tiny_data)
    done = Finished(crashed.returncode, crashed.stdout, crashed.stderr)
    return done, crashed.seconds, only_run_dir(crashed.output_dir)


@pytest.mark.parametrize("kind", ["exception", "segfault"])
def test_crash_of_one_rank_fails_the_job_and_names_the_rank(tiny_data, tmp_path_factory, kind):
    """An exception or a real SIGSEGV on rank 1: non-zero exit soon, rank 1 named, W&B failed;
    the SIGSEGV named in what launch shows (its run_ended line and launch.log)."""
    result, elapsed, run_dir = _crashed(kind, tiny_data, tmp_path_factory)
    assert result.returncode != 0
    assert elapsed < 90, f"took {elapsed:.0f}s to notice a dead rank"
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "failed" and outcome.exit_code != 0
    assert outcome.failed_rank == 1
    assert outcome.traceback is not None and outcome.traceback.endswith("rank1.jsonl")
    rank1_log = (run_dir / "logs" / "rank1.jsonl").read_text()
    if kind == "segfault":
        assert (
            "Fatal Python error: Segmentation fault" in rank1_log
        )  # faulthandler, in rank 1's log
        for where, text in (
            ("launch's output", result.stdout),
            ("launch.log", (run_dir / "logs" / "launch.log").read_text()),
        ):
            ended = [e for e in parse_events(text) if e["event"] == "run_ended"]
            assert ended and "rank 1 died with SIGSEGV" in ended[-1]["reason"], (
                f"{where} does not name the signal: {text[-2000:]}"
            )
    else:
        failed = _events(run_dir, 1, "rank_failed")
        assert failed and "injected exception" in failed[0]["error"]
        assert "Traceback" in failed[0]["exception"]
    _assert_no_finished(run_dir, result.stdout)
    assert _wandb_exit_code(run_dir) == 1  # failed, not crashed and not finished


def test_hung_rank_after_a_resume_times_out_within_the_collective_timeout(
    tmp_path, tiny_data, tmp_path_factory
):
    """After a resume (the tight timeout must hold there too, not the 60 s init timeout),
    rank 1 sleeps before step 9: rank 0 gives up after collective_timeout_s, names it and
    where it hung (file:line in function, from rank 1's stacks dumped into its log). It
    resumes a copy of the shared preempted run (:func:`preempted_run`)."""
    preempted = preempted_run(tmp_path_factory, tiny_data)
    assert preempted.returncode != 0
    run_dir = only_run_dir(copy_of(preempted.output_dir, tmp_path / "runs"))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(preempted_config(tmp_path / "runs", tiny_data,
                                                   collective_timeout_s=5)))  # fmt: skip
    # The agent forwards SIGTERM to the workers; under load that can land a step later, so
    # the stop step is read from the checkpoint the first attempt saved, not assumed.
    saved = _events(run_dir, 0, "checkpoint_saved")[-1]["step"]
    assert PREEMPTED_AT <= saved < 9, f"the first attempt stopped at step {saved}, past the hang"
    result = torchrun(cfg, env={"UPS_FAULTS": "hang@1:9"})
    assert result.returncode != 0
    assert [e["step"] for e in _events(run_dir, 0, "resumed")] == [saved]
    failed = [e for e in rank_events(run_dir, 0) if e["event"] == "outcome"][-1]
    injected = [e for e in rank_events(run_dir, 1) if e["event"] == "fault_injected"][-1]
    waited = _seconds_between(injected["timestamp"], failed["timestamp"])
    assert 4 <= waited < 30, f"rank 0 gave up {waited:.1f}s after the hang (timeout 5 s)"
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "failed"
    assert "collective_timeout_s=5s" in outcome.reason and "[1]" in outcome.reason
    assert outcome.failed_rank == 1
    # the injected hang is `time.sleep` inside FaultInjector.fire (ups/train/faults.py)
    assert re.search(r"rank 1 was at \S+/ups/train/faults\.py:\d+ in fire", outcome.reason), (
        outcome.reason
    )
    rank1_log = (run_dir / "logs" / "rank1.jsonl").read_text()
    assert "(most recent call first):" in rank1_log and "in fire" in rank1_log
    assert survivors(str(cfg)) == []


def _seconds_between(a: str, b: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _, path = list_checkpoints(run_dir / "checkpoints")[-1]
    return load_checkpoint(path)["model"]


def test_preemption_stops_every_rank_at_one_step_with_a_checkpoint(tiny_data, tmp_path_factory):
    """SIGTERM at step 5 (the shared preempted run, :func:`preempted_run`) stops all ranks
    at one step: outcome preempted (exit 75, SIGTERM), its checkpoint written, W&B told 75."""
    preempted = preempted_run(tmp_path_factory, tiny_data)
    assert preempted.returncode != 0
    run_dir = only_run_dir(preempted.output_dir)
    outcome = read_outcome(run_dir)
    assert outcome is not None and outcome.outcome == "preempted"
    assert outcome.exit_code == EXIT_PREEMPTED and outcome.signal == "SIGTERM"
    stops = [_events(run_dir, rank, "preempt_stop")[0]["step"] for rank in (0, 1)]
    assert stops[0] == stops[1] == outcome.step
    assert Path(outcome.checkpoint or "").is_file()
    assert _wandb_exit_code(run_dir) == EXIT_PREEMPTED


def test_preemption_resumes_to_match_an_uninterrupted_run(tmp_path, tiny_data, tmp_path_factory):
    """The same command again, on a copy of the shared preempted run: it continues that run
    from the preemption checkpoint and ends bit-exactly equal to an uninterrupted run."""
    preempted = preempted_run(tmp_path_factory, tiny_data)
    assert preempted.returncode != 0
    run_dir = only_run_dir(copy_of(preempted.output_dir, tmp_path / "b"))
    stopped = read_outcome(run_dir)
    assert stopped is not None and stopped.outcome == "preempted"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(preempted_config(tmp_path / "b", tiny_data)))
    reference = _final_model(uninterrupted_run(tmp_path_factory, cfg))

    second = torchrun(cfg)  # the same command again
    assert second.returncode == 0, second.stderr[-3000:]
    assert only_run_dir(tmp_path / "b") == run_dir  # continued the same run
    resumed = [e for e in parse_events(second.stdout) if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == stopped.step
    final = _final_model(run_dir)
    assert final.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(final[name], tensor), f"{name} differs after resume"
