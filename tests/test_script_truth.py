"""A script's run told truthfully, without processes: a stop's outcome built from how each
worker really ended, ranks that never met, the stop's announcement, resuming a script's
run, and the mistakes refused before anything starts (exit 2, one paragraph)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ups.cli.launch import LOG_FORMATS
from ups.cli.launch import main as launch_main
from ups.console import LOG_FORMATS as CONSOLE_LOG_FORMATS
from ups.launch.finalize import exit_code, finalize_outcome
from ups.launch.plan import LaunchPlan, LaunchRequest, build_plan
from ups.launch.ranklogs import last_words
from ups.launch.scriptrun import record_outputs
from ups.launch.torchrun import TorchrunResult, WorkerExit, stop_announcement
from ups.outcome import EXIT_CONFIG, Outcome, write_outcome
from ups.rundir import ScriptRuns, choose_run, mark_latest
from ups.workfiles import left_behind
from ups.workload import WorkloadError, load_run_file, script_workload


def _plan(tmp_path: Path, **kw: object) -> LaunchPlan:
    req = LaunchRequest(script="train.py", output_dir=str(tmp_path / "runs"), **kw)  # type: ignore[arg-type]  # kw: object
    return build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})


def _exits(*codes: int, last: str | None = None) -> list[WorkerExit]:
    return [
        WorkerExit(
            rank=r,
            local_rank=r,
            exitcode=c,
            signal={-9: "SIGKILL", -15: "SIGTERM", -6: "SIGABRT"}.get(c),
            last_line=last,
        )
        for r, c in enumerate(codes)
    ]


def _stopped(codes: tuple[int, ...], at: float, last: str | None = None) -> TorchrunResult:
    """torchrun's agent got SIGTERM: its failure list is empty, whatever the workers did."""
    return TorchrunResult(
        rc=143,
        status="signal",
        signal="SIGTERM",
        received_signal="SIGTERM",
        stopped_at=at,
        workers=_exits(*codes, last=last),
        phase="script",
    )


def _commit(plan: LaunchPlan, name: str, mtime: float) -> Path:
    directory = Path(plan.env["UPS_CHECKPOINT_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("state")
    os.utime(path, (mtime, mtime))
    return path


def test_a_stop_is_preempted_only_when_every_rank_exited_0_and_names_its_checkpoint(
    tmp_path: Path,
) -> None:
    """Every rank exited 0 after the stop: preempted (75), naming the checkpoint the script
    committed after it; one from before the stop is named as such; none is said too."""
    plan = _plan(tmp_path, run_id="a")
    stop = time.time()
    _commit(plan, "old.pt", stop - 60)
    before = finalize_outcome(plan, _stopped((0, 0), stop))
    assert (before.outcome, before.exit_code, before.cause) == ("preempted", 75, "preempted")
    assert "committed no checkpoint after it; the newest" in before.reason
    assert "old.pt, is from before the stop" in before.reason
    saved = _commit(plan, "new.pt", stop + 1)
    (Path(plan.run_dir) / "outcome.json").unlink()  # launch sets each attempt's aside
    after = finalize_outcome(plan, _stopped((0, 75), stop))
    assert after.reason == (
        "SIGTERM received by ups launch; all 2 rank(s) on node 0 exited 0 after the stop; "
        f"they committed checkpoint {saved}"
    )
    assert exit_code(after, 143) == 75
    nothing = finalize_outcome(_plan(tmp_path, run_id="b"), _stopped((0, 0), stop))
    assert "they committed no checkpoint: the same command starts the script again" in (
        nothing.reason
    )


def test_a_rank_that_did_not_exit_0_after_the_stop_fails_the_run_naming_it(
    tmp_path: Path,
) -> None:
    """A SIGTERM handler that exits 3 without saving, a rank killed after stop_grace_s, a
    script with no handler at all: failed (stopped, exit 143), never "exited 0"; the first
    such rank is named with its code or signal and its last line on stderr."""
    plan = _plan(tmp_path, run_id="c", stop_grace_s=7)
    stop = time.time()
    outcome = Path(plan.run_dir) / "outcome.json"
    three = finalize_outcome(plan, _stopped((3, 0), stop, last="leaving without saving"))
    assert (three.outcome, three.cause, three.failed_rank) == ("failed", "stopped", 0)
    assert three.reason == (
        "SIGTERM received by ups launch; rank 0 exited with code 3 after the stop; its last "
        "line on stderr: 'leaving without saving'"
    )
    assert exit_code(three, 143) == 143
    outcome.unlink()
    killed = finalize_outcome(plan, _stopped((0, -9), stop))
    assert killed.failed_rank == 1 and killed.signal == "SIGKILL"
    assert "rank 1 died of SIGKILL after the stop: still running 7 s (stop_grace_s)" in (
        killed.reason
    )
    outcome.unlink()
    unhandled = finalize_outcome(plan, _stopped((-15, -15), stop))
    assert "rank 0 died of SIGTERM after the stop: the script does not handle SIGTERM" in (
        unhandled.reason
    )
    assert unhandled.reason.endswith("1 more rank(s) did not exit 0 either")
    outcome.unlink()
    aborted = finalize_outcome(plan, _stopped((0, -6), stop, last="Fatal Python error: Aborted"))
    assert "rank 1 died of SIGABRT after the stop; its last line on stderr: 'Fatal Python" in (
        aborted.reason
    )


def test_the_trainer_saying_preempted_is_not_believed_over_a_rank_that_failed(
    tmp_path: Path,
) -> None:
    """Rank 0 wrote "preempted", but rank 1 exited 1 after the stop: the run failed, and
    keeps the trainer's checkpoint and step."""
    req = LaunchRequest(config_path="c.yaml", output_dir=str(tmp_path / "runs"), run_id="t")
    plan = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})
    run_dir = Path(plan.run_dir)
    reason = "SIGTERM received; all ranks stopped after step 4"
    written = Outcome(run_id="t", outcome="preempted", exit_code=75, reason=reason, step=4,
                      checkpoint="ck/step_4.pt")  # fmt: skip
    write_outcome(run_dir, written)
    final = finalize_outcome(plan, _stopped((75, 1), time.time()))
    assert (final.outcome, final.failed_rank, final.step, final.checkpoint) == (
        "failed",
        1,
        4,
        "ck/step_4.pt",
    )
    write_outcome(run_dir, written)
    assert finalize_outcome(plan, _stopped((75, 75), time.time())).outcome == "preempted"
    # Node 1 of two: its ranks stopped cleanly; rank 0 writes the outcome on node 0.
    req = LaunchRequest(config_path="c.yaml", output_dir=str(tmp_path / "n1"), run_id="t",
                        nnodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29400")  # fmt: skip
    node1 = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})
    other = finalize_outcome(node1, _stopped((75,), time.time()))
    assert (other.outcome, other.exit_code) == ("preempted", 75), other.reason
    assert "rank 0, on node 0, writes the run's checkpoint and outcome" in other.reason


def test_ranks_that_never_met_finish_with_a_warning(tmp_path: Path) -> None:
    """Two ranks exited 0 and wrote nothing to the rendezvous store: finished, with the
    warning in words; ranks that formed a process group (keys written) get none."""
    plan = _plan(tmp_path, run_id="m")
    alone = TorchrunResult(rc=0, status="ok", workers=_exits(0, 0), store_keys=(3, 3))
    final = finalize_outcome(plan, alone)
    assert final.outcome == "finished" and final.warnings == [
        "2 ranks ran, none joined a process group: each trained alone on its own copy (the "
        "script never calls torch.distributed.init_process_group, or its framework was told "
        "of one device only)"
    ]
    met = TorchrunResult(rc=0, status="ok", workers=_exits(0, 0), store_keys=(3, 5))
    assert finalize_outcome(_plan(tmp_path, run_id="met"), met).warnings == []
    one = _plan(tmp_path, run_id="one", nproc_per_node=1)
    solo = TorchrunResult(rc=0, status="ok", workers=_exits(0), store_keys=(3, 3))
    assert finalize_outcome(one, solo).warnings == []


def test_the_stop_says_what_is_asked_of_whom(tmp_path: Path) -> None:
    """ups's trainer stops at a step and saves; a script is only sent SIGTERM and given
    stop_grace_s: the announcement promises nothing a script cannot keep."""
    script = _plan(tmp_path, run_id="s", stop_grace_s=30)
    assert stop_announcement(script, "SIGINT") == (
        "SIGINT (Ctrl-C) received: SIGTERM sent to the script's ranks; they have 30 s "
        "(stop_grace_s) to save and exit"
    )
    req = LaunchRequest(config_path="c.yaml", output_dir=str(tmp_path / "runs"), run_id="t")
    trainer = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})
    assert "stop at the next step and save a checkpoint" in stop_announcement(trainer, "SIGTERM")


def test_last_words_are_the_exception_or_the_fatal_error_or_the_last_line() -> None:
    """What names a rank's end: its exception, Python's fatal error, or its last line."""
    assert last_words(["Traceback (most recent call last):", "  x", "ValueError: v"]) == (
        "ValueError: v"
    )
    aborted = ["Fatal Python error: Aborted", "", "Current thread 0x1 (most recent call first):"]
    assert last_words([f"[rank1]: {line}" for line in aborted]) == "Fatal Python error: Aborted"
    assert last_words(["saving", "bye", ""]) == "bye" and last_words([]) is None


def test_a_script_run_continues_under_its_run_id_with_or_without_a_checkpoint(
    tmp_path: Path,
) -> None:
    """Like `fab deploy`, the same `ups launch --script` continues its stopped run: with the
    script's newest committed checkpoint when it has one, else from the beginning; the
    reason given is the outcome's own, never a promise of a checkpoint it does not have."""
    out = tmp_path / "runs"
    run_dir = out / "train-1"
    reason = "SIGTERM received by ups launch; rank 0 died of SIGTERM after the stop"
    write_outcome(run_dir, Outcome(run_id="train-1", outcome="failed", exit_code=143,
                                   reason=reason, cause="stopped"))  # fmt: skip
    mark_latest(out, run_dir)
    choice = choose_run(out, "train", script=ScriptRuns())
    assert choice.run_id == "train-1" and choice.resume is not None
    assert (choice.resume.checkpoint, choice.resume.why) == (None, reason)
    assert choose_run(out, "train").resume is None  # the trainer needs its step_N.pt
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "snapshot.pt").write_text("x")
    again = choose_run(out, "train", script=ScriptRuns())
    assert again.resume is not None
    assert again.resume.checkpoint == str(run_dir / "checkpoints" / "snapshot.pt")


def test_a_missing_script_is_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ups launch --script nope.py`: exit 2, one paragraph, no run directory, nothing run."""
    out = tmp_path / "runs"
    assert launch_main(["--script", str(tmp_path / "nope.py"), "--output-dir", str(out)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("ups launch: --script ") and "is not a file" in said
    assert said.count("\n") == 1 and not out.exists()
    assert LOG_FORMATS == CONSOLE_LOG_FORMATS


def test_a_checkpoint_dir_that_would_hold_ups_runs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checkpoint_dir: .` (the workdir) in a run file, and a --checkpoint-dir that holds ups's
    output directory, are refused with exit 2 before a run directory exists: UPS_RESUME
    would otherwise name ups's own runs/ folder."""
    (tmp_path / "train.py").write_text("")
    run_file = tmp_path / "ups-run.yaml"
    run_file.write_text("script: train.py\ncheckpoint_dir: .\n")
    with pytest.raises(WorkloadError, match=r"checkpoint_dir: '\.' is the workdir itself"):
        load_run_file(run_file)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs"
    code = launch_main(["--script", "train.py", "--checkpoint-dir", ".", "--output-dir", str(out)])
    assert code == EXIT_CONFIG and not out.exists()
    assert "is the workdir itself" in capsys.readouterr().err
    above = ["--script", "train.py", "--checkpoint-dir", str(tmp_path), "--output-dir", str(out)]
    tmp_sub = tmp_path / "sub"
    tmp_sub.mkdir()
    monkeypatch.chdir(tmp_sub)
    above[1] = str(tmp_path / "train.py")
    assert launch_main(above) == EXIT_CONFIG
    assert "holds ups's output directory" in capsys.readouterr().err and not out.exists()


def test_a_script_or_setup_file_the_sync_leaves_behind_is_named_with_its_rule(
    tmp_path: Path,
) -> None:
    """A script excluded by the run file's `exclude`, a requirements file that .gitignore
    leaves out (in a git checkout and outside one): each named with the rule."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "requirements.txt").write_text("")
    (tmp_path / ".gitignore").write_text("# deps\nrequirements*.txt\n")
    run_file = tmp_path / "ups-run.yaml"
    run_file.write_text(
        "script: train.py\nexclude: ['*.py']\nsetup: ['pip install -r requirements.txt']\n"
    )
    problems = left_behind(load_run_file(run_file))
    assert problems == [
        "script: 'train.py' would not reach the host: it is left out by `exclude: *.py`. Add "
        "it to `include:` in a run file (or remove that rule); nothing was started",
        "setup: 'requirements.txt' would not reach the host: it is left out by .gitignore:2: "
        "requirements*.txt. Add it to `include:` in a run file (or remove that rule); nothing "
        "was started",
    ]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert "by .gitignore:2: requirements*.txt" in left_behind(load_run_file(run_file))[1]
    assert left_behind(script_workload(str(tmp_path / "train.py"))) == []


def test_outputs_outside_the_run_directory_are_recorded_for_fetch(tmp_path: Path) -> None:
    """A run file's checkpoint_dir and `outputs:` globs are listed in script-outputs.json,
    relative to the workdir; what lies in the run directory, or inside a listed folder,
    is not listed twice; a glob that matched nothing is said."""
    work = tmp_path / "w"
    (work / "lightning_logs" / "version_0").mkdir(parents=True)
    (work / "lightning_logs" / "version_0" / "epoch=1.ckpt").write_text("c")
    (work / "ckpts").mkdir()
    os.chdir(work)
    try:
        plan = _plan(tmp_path, run_id="o", checkpoint_dir="ckpts",
                     outputs=["lightning_logs", "lightning_logs/**/*.ckpt", "*.csv"])  # fmt: skip
    finally:
        os.chdir(tmp_path)
    Path(plan.run_dir).mkdir(parents=True)
    record = record_outputs(plan)
    assert record is not None
    assert record["paths"] == ["ckpts", "lightning_logs"] and record["missing"] == ["*.csv"]
    assert json.loads((Path(plan.run_dir) / "script-outputs.json").read_text()) == record
    default = _plan(tmp_path, run_id="d")
    Path(default.run_dir, "checkpoints").mkdir(parents=True)
    assert (record_outputs(default) or {})["paths"] == []
