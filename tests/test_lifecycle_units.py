"""Lifecycle rules without processes: grace values agree, the retry table, which run the
same command continues, resume checks, the OOM-killer verdict, a full disk under the tee."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

import fabfile
from tests.conftest import PYTHON, REPO
from ups.deploy import tasks as deploy_tasks
from ups.deploy.onhost import operate as deploy_execute
from ups.grace import DEFAULT_STOP_GRACE_S, container_grace_s, stop_wait_s
from ups.launch.oom import MemorySnapshot, explain_sigkill, snapshot
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.tee import LineTee
from ups.outcome import Outcome, read_outcome, write_outcome
from ups.retry import RETRY_TABLE, resume_hint, retry_verdict, table_markdown
from ups.rundir import LAUNCH_PID, choose_run, mark_latest, newest_checkpoint, record_launch
from ups.train.resume import ResumeRefused, check_resume, remapped_step


def _seconds(compose_duration: str) -> int:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(compose_duration))
    assert m and any(m.groups()), compose_duration
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's own tags (``!reset``, ``!override``) read as plain values."""


_ComposeLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_stop_grace_drives_torchrun_compose_and_fab_stop() -> None:
    """One setting, distributed.stop_grace_s: torchrun's --shutdown-timeout is it, every
    compose service running `ups launch` gives it plus launch's margin, and `fab stop`
    waits longer still, so no outer layer kills a checkpoint the inner one allows."""
    plan = build_plan(
        LaunchRequest(script="t.py", run_id="g"), None, gpu_count=0, pick_port=lambda p: p
    )
    assert f"--shutdown-timeout={DEFAULT_STOP_GRACE_S}" in plan.torchrun_argv
    compose = yaml.load((REPO / "docker-compose.yml").read_text(), Loader=_ComposeLoader)
    graces = {
        name: _seconds(svc["stop_grace_period"])
        for name, svc in compose["services"].items()
        if name.startswith("train")
    }
    assert graces and set(graces.values()) == {container_grace_s()}, graces
    assert container_grace_s() > DEFAULT_STOP_GRACE_S
    for fn, arg in (
        (fabfile.stop.body, "timeout"),
        (deploy_tasks.stop, "timeout"),
        (deploy_execute.stop, "timeout_s"),
    ):
        default = inspect.signature(fn).parameters[arg].default
        assert default == stop_wait_s() > container_grace_s(), fn


def test_the_retry_table_is_documented_where_users_read() -> None:
    """docs/runbook.md and docs/launch.md show the retry table exactly as the code defines it."""
    table = table_markdown()
    for doc in ("docs/runbook.md", "docs/launch.md"):
        assert table in (REPO / doc).read_text(), f"{doc} lacks the current retry table"


def _failed(cause: str | None, code: int = 1) -> Outcome:
    return Outcome(run_id="r", outcome="failed", exit_code=code, reason="x", cause=cause)


def test_retry_verdicts() -> None:
    """Crashes, kills, hangs, preemption, a failed save (once space is freed) and a missing
    outcome are retried; a bad config, a non-finite loss, an exception, OOM skips and
    anything unclassified are not."""
    assert retry_verdict(None)[0]
    assert retry_verdict(Outcome(run_id="r", outcome="preempted", exit_code=75, reason=""))[0]
    for cause in ("rank_signal", "hang", "peer_died", "stopped", "save_failed"):
        assert retry_verdict(_failed(cause))[0], cause
    for cause in ("exception", "nonfinite", "too_many_oom_skips", "oom_in_step", "config"):
        assert not retry_verdict(_failed(cause))[0], cause
    assert not retry_verdict(_failed(None))[0]
    assert not retry_verdict(_failed(None, code=2))[0]  # older outcome: the code tells
    assert not retry_verdict(_failed(None, code=65))[0]
    assert not retry_verdict(Outcome(run_id="r", outcome="finished", exit_code=0, reason=""))[0]
    assert len({r.cause for r in RETRY_TABLE}) == len(RETRY_TABLE)


def test_resume_hint_says_slurm_brings_the_job_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside Slurm a stopped run goes on with the same command (a script hears what it
    gets as UPS_RESUME); in a Slurm job (SLURM_JOB_ID, which the ranks inherit) the requeue
    brings it back by itself, for the trainer and a script alike."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert resume_hint(checkpoint="ck/step_4.pt") == (
        "run the same command again to continue from the last checkpoint"
    )
    assert resume_hint(script=True, checkpoint="ck/step_4") == (
        "run the same command again: the script gets UPS_RESUME=ck/step_4"
    )
    assert resume_hint(script=True, checkpoint=None) == (
        "run the same command again to start the script again"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    slurm = (
        "a requeued Slurm job (slurm job 17) starts again by itself from here; after "
        "`fab stop`, the same `fab deploy` continues it"
    )
    assert resume_hint(checkpoint="ck/step_4.pt") == slurm
    assert resume_hint(script=True, checkpoint="ck/step_4") == slurm


def test_launch_promises_a_checkpoint_only_where_the_run_has_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during preflight left a config run without a checkpoint: the end line said
    "run the same command again to continue from the last checkpoint", where the same
    command starts a new run from step 0 (``ups.rundir.resumable``). The hint now looks at
    the run directory, as the next launch will; an outcome launch wrote names none."""
    from ups.launch.execute import _resume_hint

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir = tmp_path / "runs" / "c1"
    script_plan = build_plan(
        LaunchRequest(script="t.py", run_id="c1", output_dir=str(tmp_path / "runs")),
        None, gpu_count=0, pick_port=lambda p: p,
    )  # fmt: skip
    plan = dataclasses.replace(script_plan, script=None, run_dir=str(run_dir))
    stopped = Outcome(run_id="c1", outcome="failed", exit_code=130, reason="SIGINT")
    assert _resume_hint(plan, stopped) == (
        "no checkpoint was written, so the same command starts a new run from step 0"
    )
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000100.pt").write_bytes(b"x")
    assert _resume_hint(plan, stopped) == (
        "run the same command again to continue from the last checkpoint"
    )
    assert newest_checkpoint(run_dir) == (100, run_dir / "checkpoints" / "step_000100.pt")


def _run_dir(out: Path, run_id: str, outcome: Outcome | None, ckpt: bool = True) -> Path:
    run_dir = out / run_id
    (run_dir / "checkpoints").mkdir(parents=True)
    if ckpt:
        (run_dir / "checkpoints" / "step_000008.pt").write_bytes(b"c")
    if outcome is not None:
        write_outcome(run_dir, outcome)
    mark_latest(out, run_dir)
    return run_dir


def test_same_command_continues_a_run_killed_without_an_outcome(tmp_path: Path) -> None:
    """A run whose launch was killed (no outcome.json) is continued from its checkpoint,
    with its step and why; --fresh starts a new one instead."""
    _run_dir(tmp_path, "t-1", None)
    choice = choose_run(tmp_path, "t")
    assert choice.run_id == "t-1" and choice.resume is not None
    assert choice.resume.step == 8 and "no outcome.json" in choice.resume.why
    fresh = choose_run(tmp_path, "t", fresh=True)
    assert fresh.run_id != "t-1" and fresh.resume is None


def test_deterministic_failures_and_live_runs_are_not_continued(tmp_path: Path) -> None:
    """A run that failed for a non-retryable cause, one without a checkpoint, and one whose
    launch is still alive each get a new run id, with the reason said."""
    run_dir = _run_dir(tmp_path, "t-1", _failed("nonfinite"))
    choice = choose_run(tmp_path, "t")
    assert choice.run_id != "t-1" and "non-finite" in (choice.note or "")
    write_outcome(run_dir, _failed("rank_signal"))
    assert choose_run(tmp_path, "t").run_id == "t-1"
    record_launch(run_dir)  # this test process plays a launch that is still running
    choice = choose_run(tmp_path, "t")
    assert choice.run_id != "t-1" and "still running" in (choice.note or "")
    (run_dir / LAUNCH_PID).unlink()
    _run_dir(tmp_path, "t-2", None, ckpt=False)
    choice = choose_run(tmp_path, "t")
    assert choice.run_id != "t-2" and "no checkpoint" in (choice.note or "")


_FACTS = {
    "world_size": 2,
    "batch_size": 8,
    "global_batch": 16,
    "config": {"training": {"lr": 0.003}, "seed": 0},
    "config_digest": "a",
    "torch": "2.13.0",
    "data": {"advection": {"size": 10, "head_sha256": "ab" * 32}},
}


def test_resume_refusal_lists_every_difference() -> None:
    """World size, config, torch and data all differ: one paragraph names each, with the
    flag that allows it; allowing all of them returns the changes to log."""
    now = json.loads(json.dumps(_FACTS))
    now.update(world_size=1, global_batch=8, torch="2.14.0")
    now["config"]["training"]["lr"] = 0.01
    now["data"]["advection"]["size"] = 11
    with pytest.raises(ResumeRefused) as err:
        check_resume(_FACTS, now, [], "ckpt.pt")
    text = str(err.value)
    pieces = [
        "world size 2 -> 1",
        "training.lr 0.003 -> 0.01",
        "torch 2.13.0 -> 2.14.0",
        "data file of task advection",
        "--allow-resume-change config,data,torch,world_size",
    ]
    for piece in pieces:
        assert piece in text, piece
    assert "\n" not in text
    notes = check_resume(_FACTS, now, ["world_size", "config", "torch", "data"], "ckpt.pt")
    assert len(notes) == 4
    assert remapped_step(10, _FACTS, now) == 20  # same samples seen at half the global batch


def _cgroup(tmp_path: Path, v1: bool, kills: int, limit: str) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    d = root / ("memory" if v1 else "") / "job"
    d.mkdir(parents=True)
    if v1:
        control = f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
        (d / "memory.oom_control").write_text(control)
        (d / "memory.limit_in_bytes").write_text(limit + "\n")
        proc = "4:memory:/job\n"
    else:
        (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\n")
        (d / "memory.max").write_text(limit + "\n")
        proc = "0::/job\n"
    (tmp_path / "cgroup").write_text(proc)
    return root, tmp_path / "cgroup"


@pytest.mark.parametrize("v1", [True, False], ids=["cgroup-v1", "cgroup-v2"])
def test_oom_killer_verdict_from_the_cgroup_counters(tmp_path: Path, v1: bool) -> None:
    """The cgroup's oom_kill counter rising across the run means the OOM killer: the hint
    says what to lower; unchanged means something else sent SIGKILL."""
    root, proc = _cgroup(tmp_path, v1, 0, "8589934592")
    before = snapshot(root, proc)
    assert before == MemorySnapshot(0, 8 * 2**30, before.source)
    killed = MemorySnapshot(1, 8 * 2**30, before.source)
    verdict = explain_sigkill(before, killed, {0: 2**30, 1: 3 * 2**30}, 1, None)
    assert verdict["oom_killer"] is True and "training.batch_size" in verdict["hint"]
    assert verdict["peak_rss_bytes"] == {"0": 2**30, "1": 3 * 2**30}
    verdict = explain_sigkill(before, before, {}, 1, None)
    assert verdict["oom_killer"] is False and "not the kernel's OOM killer" in verdict["hint"]
    assert "8.00 GiB" in verdict["hint"]


def test_full_disk_under_launch_log_keeps_the_console(tmp_path: Path) -> None:
    """launch.log on a device that is full (/dev/full: ENOSPC on every write): every line
    still reaches the console, and one notice says the log file stopped."""
    console = io.StringIO()
    with LineTee(Path("/dev/full"), console, render=False) as tee:
        tee.write_line("one")
        tee.write_line("two")
    shown = console.getvalue().splitlines()
    assert shown[1:] == ["one", "two"] and "No space left" in shown[0]


def test_unreadable_outcome_counts_as_no_outcome(tmp_path: Path) -> None:
    """An outcome.json cut short by a full disk reads as "no outcome" (killed), not a crash."""
    (tmp_path / "outcome.json").write_text('{"run_id": "r", "outc')
    assert read_outcome(tmp_path) is None


@pytest.mark.slow
def test_launch_reports_a_full_disk_without_a_traceback(tmp_path: Path) -> None:
    """`ups launch --script` with its output dir on a full tmpfs: exit code of the run
    kept (0), the console says what could not be written, and no traceback."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "runs" / "r1" / "logs").mkdir(parents=True)
        with (mnt / "filler").open("wb") as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        script = tmp_path / "ok.py"
        script.write_text("print('worker ran')\n")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [PYTHON, "-m", "ups", "launch", "--script", str(script), "--run-id", "r1",
             "--output-dir", str(mnt / "runs"), "--skip-preflight"],
            capture_output=True, text=True, timeout=180, cwd=REPO, env=env,
        )  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "worker ran" in text
    assert "launch.log" in text and "No space left" in text
    assert "could not write outcome.json" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    """What a checkpoint saves of the CUDA generators (every local device) brings back the
    same random numbers after resume, through the real save and weights_only load."""
    from ups.train.checkpoint import latest_good_checkpoint, save_checkpoint
    from ups.train.resume import restore_rng, rng_state

    torch.cuda.manual_seed_all(7)
    save_checkpoint(tmp_path, 1, rng_state(), keep_last=1)
    expected = [torch.rand(4, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
    hit = latest_good_checkpoint(tmp_path)
    assert hit is not None
    assert restore_rng(hit[1]) is None
    again = [torch.rand(4, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
    assert all(torch.equal(a, b) for a, b in zip(expected, again, strict=True))


@pytest.mark.parametrize("workers_failed", [False, True])
def test_a_stop_after_every_rank_finished_keeps_the_run_finished(
    tmp_path: Path, workers_failed: bool
) -> None:
    """SIGTERM reaching ups launch during the final evaluation: the ranks finish, write
    "finished" and exit 0, torchrun exits 143. The run is finished (exit 0, the stop noted),
    not "failed". A worker that did fail still turns "finished" into "failed"."""
    from ups.launch.finalize import exit_code, finalize_outcome
    from ups.launch.torchrun import TorchrunResult, WorkerFailure

    plan = build_plan(
        LaunchRequest(script="t.py", run_id="r1", output_dir=str(tmp_path)),
        None, gpu_count=0, pick_port=lambda p: p,
    )  # fmt: skip
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    write_outcome(run_dir, Outcome(run_id="r1", outcome="finished", exit_code=0, reason="done"))
    failures = [
        WorkerFailure(
            rank=1, local_rank=1, exitcode=1, signal=None, error_file=None, message="x", timestamp=1
        )
    ]
    result = TorchrunResult(
        rc=143, status="signal", signal="SIGTERM", received_signal="SIGTERM",
        failures=failures if workers_failed else [], phase="evaluation",
    )  # fmt: skip
    final = finalize_outcome(plan, result)
    assert read_outcome(run_dir) == final
    if workers_failed:
        assert (final.outcome, exit_code(final, result.rc)) == ("failed", 143)
    else:
        assert (final.outcome, exit_code(final, result.rc)) == ("finished", 0)
        assert "received SIGTERM after every rank had finished" in final.reason
