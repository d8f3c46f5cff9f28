"""`ups launch` without processes: the plan, outcome finalization, the tee and `latest`."""

from __future__ import annotations

import io
import json
import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from ups.cli.launch import main as launch_main
from ups.config import load_config
from ups.launch.finalize import exit_code, finalize_outcome, set_aside_previous_outcome
from ups.launch.plan import LaunchPlan, LaunchRequest, build_plan
from ups.launch.tee import LineTee
from ups.launch.torchrun import TorchrunResult, WorkerFailure
from ups.outcome import EXIT_CONFIG, Outcome, read_outcome, write_outcome
from ups.preflight.checks.ports import pick_free_port
from ups.rundir import mark_latest


def _plan(tmp_path: Path, **kw: object) -> LaunchPlan:
    req = LaunchRequest(script="train.py", output_dir=str(tmp_path / "runs"), **kw)  # type: ignore[arg-type]  # kw: object
    return build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})


def test_dry_run_prints_the_plan_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ups launch --script S --dry-run -- args` prints a JSON plan (ids, torchrun argv, env,
    ports) and exits 0 without creating the run directory."""
    out = tmp_path / "runs"
    script = tmp_path / "my_train.py"
    script.write_text("")
    argv = ["--script", str(script), "--output-dir", str(out), "--run-id", "r1"]
    argv += ["--master-port", str(pick_free_port(0)), "--dry-run", "--", "--lr", "0.1"]
    assert launch_main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["run_id"] == "r1"
    assert plan["run_dir"] == str(out / "r1")
    assert plan["nproc_per_node"] == 2 and plan["nproc_source"] == "cpu-default"
    assert plan["world_size"] == 2
    argv_ = plan["torchrun_argv"]
    assert "--rdzv-backend=static" in argv_
    assert f"--rdzv-endpoint=127.0.0.1:{plan['master_port']}" in argv_
    assert f"--log-dir={out / 'r1' / 'torchelastic' / 'node0'}" in argv_
    assert "--rdzv-conf=timeout=300" in argv_
    assert argv_[-3:] == [str(script), "--lr", "0.1"]
    assert plan["env"]["UPS_RUN_ID"] == "r1"
    assert plan["env"]["UPS_RUN_DIR"] == str(out / "r1")
    assert plan["env"]["PYTHONFAULTHANDLER"] == "1"
    assert plan["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert not out.exists()


def test_trainer_plan_passes_config_overrides_and_run_id(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """With a CONFIG, workers run `python -m ups.train.main CONFIG --set ...` with the user's
    overrides plus the run id, and nproc comes from distributed.nproc_per_node."""
    path = make_config(distributed={"nproc_per_node": 3})
    cfg = load_config(path, ["training.lr=0.01"])
    req = LaunchRequest(config_path=str(path), overrides=["training.lr=0.01"], run_id="abc")
    plan = build_plan(req, cfg, gpu_count=0, pick_port=lambda p: p, environ={})
    assert plan.nproc_per_node == 3 and plan.nproc_source == "config"
    assert plan.worker_argv == [
        "-m", "ups.train.main", str(path), "--set", "training.lr=0.01", "--set", "run.run_id=abc",
    ]  # fmt: skip
    assert plan.run_dir == str(tmp_path / "runs" / "abc")
    assert plan.master_port_preferred == cfg.distributed.master_port


def test_nproc_flag_beats_config_and_gpus_beat_cpu_default(tmp_path: Path) -> None:
    """--nproc-per-node wins; without flag or config a GPU host gets one worker per GPU."""
    assert _plan(tmp_path, nproc_per_node=5).nproc_per_node == 5
    req = LaunchRequest(script="t.py", output_dir=str(tmp_path))
    gpu_plan = build_plan(req, None, gpu_count=4, pick_port=lambda p: p, environ={})
    assert (gpu_plan.nproc_per_node, gpu_plan.nproc_source) == (4, "gpus")
    assert "OMP_NUM_THREADS" not in gpu_plan.env


def test_taken_master_port_is_switched_in_the_plan(tmp_path: Path) -> None:
    """A master port held by a real socket is replaced by a free one, and the plan says why."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        req = LaunchRequest(script="t.py", output_dir=str(tmp_path), master_port=port)
        plan = build_plan(req, None, gpu_count=0, pick_port=pick_free_port, environ={})
    assert plan.master_port_preferred == port
    assert plan.master_port != port
    assert plan.port_note and str(port) in plan.port_note
    assert f"--rdzv-endpoint=127.0.0.1:{plan.master_port}" in plan.torchrun_argv


def test_multi_node_needs_endpoint_and_shared_run_id(tmp_path: Path) -> None:
    """Several nodes: no --rdzv-endpoint or no fixed run id is a user error naming the fix;
    a valid request plans node ranks and keeps the shared endpoint unchanged."""
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        LaunchRequest(script="t.py", nnodes=2)
    with pytest.raises(ValueError, match="--run-id"):
        _plan(tmp_path, nnodes=2, rdzv_endpoint="127.0.0.1:1234")
    with pytest.raises(ValueError, match="HOST:PORT"):
        LaunchRequest(script="t.py", nnodes=2, rdzv_endpoint="nohost")
    plan = _plan(tmp_path, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:1234", run_id="x")
    assert plan.world_size == 4 and not plan.rdzv_host
    assert "--node-rank=1" in plan.torchrun_argv
    assert "--rdzv-endpoint=10.0.0.1:1234" in plan.torchrun_argv


def test_cli_reports_bad_flags_with_config_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    """Neither CONFIG nor --script: exit 2 (bad config/flags) with a message, nothing started."""
    assert launch_main(["--dry-run"]) == EXIT_CONFIG
    assert "CONFIG" in capsys.readouterr().err


def _failure(rank: int, **kw: object) -> WorkerFailure:
    base: dict[str, object] = {
        "local_rank": rank, "exitcode": 1, "signal": None, "error_file": None,
        "message": "", "timestamp": 100,
    }  # fmt: skip
    base.update(kw)
    return WorkerFailure(rank=rank, **base)  # type: ignore[arg-type]  # values are object


def test_segfault_without_trainer_outcome_is_named(tmp_path: Path) -> None:
    """A rank killed by SIGSEGV that wrote nothing: outcome.json names the rank, the signal,
    and points at where its output went; the exit code is torchrun's."""
    plan = _plan(tmp_path)
    Path(plan.run_dir).mkdir(parents=True)
    result = TorchrunResult(
        rc=1,
        status="failed",
        failures=[_failure(0, exitcode=-15, signal="SIGTERM", timestamp=90),
                  _failure(1, exitcode=-11, signal="SIGSEGV")],
    )  # fmt: skip
    outcome = finalize_outcome(plan, result)
    assert (outcome.outcome, outcome.failed_rank, outcome.signal) == ("failed", 1, "SIGSEGV")
    assert "rank 1 died with SIGSEGV" in outcome.reason
    assert outcome.traceback == plan.log_path
    assert read_outcome(Path(plan.run_dir)) == outcome
    assert exit_code(outcome, result.rc) == 1


def test_trainer_outcome_is_kept_and_amended(tmp_path: Path) -> None:
    """The trainer's own outcome wins; a failure without a rank gets torchrun's rank added;
    a "finished" contradicted by a crashed rank becomes "failed"; preempted exits 75."""
    plan = _plan(tmp_path)
    run_dir = Path(plan.run_dir)
    crash = TorchrunResult(rc=1, status="failed", failures=[_failure(1, message="ValueError: x")])

    write_outcome(run_dir, Outcome(run_id="r", outcome="failed", exit_code=1, reason="oom"))
    amended = finalize_outcome(plan, crash)
    assert (amended.reason, amended.failed_rank) == ("oom", 1)

    write_outcome(run_dir, Outcome(run_id="r", outcome="finished", exit_code=0, reason="ok"))
    contradicted = finalize_outcome(plan, crash)
    assert contradicted.outcome == "failed" and "ValueError: x" in contradicted.reason

    write_outcome(run_dir, Outcome(run_id="r", outcome="preempted", exit_code=75, reason="term"))
    preempted = finalize_outcome(plan, TorchrunResult(rc=1, status="failed"))
    assert preempted.outcome == "preempted" and exit_code(preempted, 1) == 75


def test_previous_outcome_is_set_aside_on_resume(tmp_path: Path) -> None:
    """Relaunching a run id moves the old outcome.json away, so a crash of the new attempt
    is never reported with the old attempt's "finished" or "preempted"."""
    write_outcome(tmp_path, Outcome(run_id="r", outcome="preempted", exit_code=75, reason="t"))
    moved = set_aside_previous_outcome(tmp_path)
    assert moved is not None and moved.exists()
    assert read_outcome(tmp_path) is None


def test_finished_is_never_reported_for_a_non_zero_exit() -> None:
    """An outcome that is not "finished" never exits 0, whatever torchrun returned."""
    failed = Outcome(run_id="r", outcome="failed", exit_code=3, reason="x")
    assert exit_code(failed, 0) == 3
    assert exit_code(Outcome(run_id="r", outcome="finished", exit_code=0, reason=""), 0) == 0


def test_tee_writes_raw_lines_to_file_and_renders_for_terminals(tmp_path: Path) -> None:
    """Every line lands raw in launch.log; a terminal gets JSON events rendered for people,
    and partial writes are joined into whole lines."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    console = Tty()
    with LineTee(tmp_path / "logs" / "launch.log", console) as tee:
        tee.write('{"event": "train_step", "level": "info", "step": 3}\nplain ')
        tee.write("torchrun line\n")
    lines = (tmp_path / "logs" / "launch.log").read_text().splitlines()
    assert lines == ['{"event": "train_step", "level": "info", "step": 3}', "plain torchrun line"]
    shown = re.sub(r"\x1b\[[0-9;]*m", "", console.getvalue())  # drop colour codes
    assert "train_step" in shown and "step=3" in shown and '{"event"' not in shown


def test_same_command_after_preemption_reuses_the_run_id(tmp_path: Path) -> None:
    """When `latest` is a preempted run of the same name with a checkpoint, planning the
    same command again picks that run id (so it resumes); after a finished run it plans a
    new one."""
    out = tmp_path / "runs"
    first = _plan(tmp_path)
    run_dir = Path(first.run_dir)
    mark_latest(out, run_dir)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000004.pt").write_bytes(b"checkpoint")
    write_outcome(
        run_dir, Outcome(run_id=first.run_id, outcome="preempted", exit_code=75, reason="t")
    )
    assert _plan(tmp_path).run_id == first.run_id
    write_outcome(run_dir, Outcome(run_id=first.run_id, outcome="finished", exit_code=0, reason=""))
    assert _plan(tmp_path).run_id != first.run_id


def test_tee_keeps_the_log_when_the_console_goes_away(tmp_path: Path) -> None:
    """A dropped SSH session (EPIPE on stdout) does not stop launch: launch.log keeps
    receiving every line."""

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    with LineTee(tmp_path / "launch.log", Gone(), render=False) as tee:
        tee.write_line("one")
        tee.write_line("two")
    assert (tmp_path / "launch.log").read_text().splitlines() == ["one", "two"]


def test_trainer_failure_gets_the_signal_torchrun_saw(tmp_path: Path) -> None:
    """The trainer's survivor reports "a peer died"; launch adds that rank 1 died of SIGSEGV
    (ranked above rank 0's own non-zero exit, which was only the reaction)."""
    plan = _plan(tmp_path)
    write_outcome(
        Path(plan.run_dir),
        Outcome(run_id="r", outcome="failed", exit_code=1, reason="a peer rank died at step 2"),
    )
    result = TorchrunResult(
        rc=1,
        status="failed",
        failures=[_failure(0, message="RuntimeError: Connection reset by peer", timestamp=50),
                  _failure(1, exitcode=-11, signal="SIGSEGV", timestamp=60)],
    )  # fmt: skip
    outcome = finalize_outcome(plan, result)
    assert (outcome.failed_rank, outcome.signal) == (1, "SIGSEGV")
    assert outcome.reason.startswith(
        "a peer rank died at step 2; torchrun: rank 1 died with SIGSEGV"
    )


_GLOO_RESET = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:41022"
)


@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("reversed_order", [False, True])
@pytest.mark.parametrize("trainer_wrote", [None, "guessed", "unknown"])
def test_the_killed_rank_is_blamed_whatever_order_the_reports_arrive_in(
    tmp_path: Path, victim: int, reversed_order: bool, trainer_wrote: str | None
) -> None:
    """An outside SIGKILL of ``victim``; its peer saw the connection drop and exited 1 in
    the same second. Whichever report comes first, whatever the survivor (rank 0, when
    alive) wrote, the outcome names the victim, SIGKILL, cause rank_signal, and its log."""
    plan = _plan(tmp_path)
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    peer = 1 - victim
    reports = [
        _failure(victim, exitcode=-9, signal="SIGKILL"),
        _failure(peer, message=_GLOO_RESET),
    ]
    if reversed_order:
        reports.reverse()
    if victim == 1 and trainer_wrote is not None:  # rank 0 survived and wrote its outcome
        write_outcome(run_dir, Outcome(
            run_id="r", outcome="failed", exit_code=1, cause="peer_died",
            reason="a peer rank died at step 2 (rank 0 saw: RuntimeError: ...)",
            # The survivor's guess from the step counters may name itself; or no one.
            failed_rank=0 if trainer_wrote == "guessed" else None,
            traceback=str(run_dir / "logs" / "rank0.jsonl") if trainer_wrote == "guessed" else None,
        ))  # fmt: skip
    outcome = finalize_outcome(plan, TorchrunResult(rc=1, status="failed", failures=reports))
    blame = (outcome.failed_rank, outcome.signal, outcome.cause)
    assert blame == (victim, "SIGKILL", "rank_signal")
    assert f"rank {victim} died with SIGKILL" in outcome.reason
    assert outcome.traceback is not None and f"rank{peer}" not in outcome.traceback


def test_a_real_exception_beats_a_broken_connection_and_torchruns_cleanup() -> None:
    """Rank 2 raised; rank 0 saw a broken collective, rank 1 was SIGTERMed by torchrun and
    rank 3 SIGKILLed after the grace: rank 2 is the cause, whatever the order. A crash
    signal beats them all."""
    reports = [
        _failure(0, message=_GLOO_RESET, timestamp=99),
        _failure(1, exitcode=-15, signal="SIGTERM", timestamp=98),
        _failure(2, message="ValueError: bad shape", timestamp=100),
        _failure(3, exitcode=-9, signal="SIGKILL", timestamp=97),
    ]
    for order in (reports, reports[::-1]):
        assert TorchrunResult(rc=1, status="failed", failures=order).root_cause() == reports[2]
    crashed = [*reports, _failure(4, exitcode=-7, signal="SIGBUS", timestamp=101)]
    assert TorchrunResult(rc=1, status="failed", failures=crashed).root_cause().rank == 4  # type: ignore[union-attr]  # not None: failures given


def test_output_dir_flag_reaches_the_trainer(
    make_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output-dir` with a CONFIG moves the run dir for launch and the trainer alike."""
    config = make_config()
    out = tmp_path / "elsewhere"
    assert launch_main([str(config), "--output-dir", str(out), "--run-id", "o", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["run_dir"] == str(out / "o")
    assert f"run.output_dir={out}" in plan["worker_argv"]


def test_ctrl_c_before_the_run_starts_is_one_line_not_a_traceback(
    make_config: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C in the second or two ``ups launch`` spends importing, checking the config
    and planning (seen in tmux: a 25-line KeyboardInterrupt traceback ending in an import)
    says so in one line and exits 130; nothing was made."""
    import ups.train.startcheck

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ups.train.startcheck, "start_problems", interrupted)
    try:
        code = launch_main([str(make_config())])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C before the run escaped ups launch as a traceback")
    assert code == 130
    assert capsys.readouterr().err == "ups launch: stopped by Ctrl-C before anything started\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("ended", ["preempted", "failed"])
def test_a_signal_during_the_wrap_up_keeps_how_the_run_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ended: str
) -> None:
    """A SIGTERM that reaches `ups launch` after its run ended preempted (seen in a 2-node
    Slurm job: srun ends the step on the other node's exit 75 while this node still wraps
    up) keeps that outcome and its exit code 75: the run was not failed by the signal. An
    attempt with no whole ending (here: failed only later) becomes failed, 143."""
    import signal

    import ups.launch.execute as execute

    plan = _plan(tmp_path, run_id="r1")
    run_dir = Path(plan.run_dir)

    def ran_then_stopped(*_args: object) -> int:
        if ended == "preempted":
            write_outcome(run_dir, Outcome(run_id="r1", outcome="preempted", exit_code=75,
                                           reason="stopped at step 4", world_size=2))  # fmt: skip
        raise execute._Stopped(signal.SIGTERM)

    monkeypatch.setattr(execute, "_gate_and_run", ran_then_stopped)
    monkeypatch.setattr(execute, "sweep", lambda: None)
    code = execute.execute(plan, None, gpu_count=0, console=io.StringIO(), render=False)
    outcome = read_outcome(run_dir)
    assert outcome is not None
    if ended == "preempted":
        assert (code, outcome.outcome, outcome.exit_code) == (75, "preempted", 75)
        log = (run_dir / "logs" / "launch.log").read_text()
        assert "SIGTERM arrived while ups launch wrapped up the run" in log
    else:
        assert (code, outcome.outcome, outcome.cause) == (143, "failed", "stopped")


def test_a_signal_while_torchrun_starts_names_that_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM in the moment between `torchrun_starting` and torchrun taking the signals
    over (seen under load in test_lifecycle_signals) ends the run failed, 143, in phase
    torchrun_start, saying torchrun was starting; not "while it wrapped up the run"."""
    import signal

    import ups.launch.execute as execute

    plan = _plan(tmp_path, run_id="r2", skip_preflight=True)

    def stopped_as_torchrun_starts(*_args: object, **_kwargs: object) -> None:
        raise execute._Stopped(signal.SIGTERM)

    monkeypatch.setattr(execute, "_run_on_a_free_port", stopped_as_torchrun_starts)
    monkeypatch.setattr(execute, "sweep", lambda: None)
    code = execute.execute(plan, None, gpu_count=0, console=io.StringIO(), render=False)
    outcome = read_outcome(Path(plan.run_dir))
    assert outcome is not None
    assert (code, outcome.outcome, outcome.cause, outcome.phase) == (
        143,
        "failed",
        "stopped",
        "torchrun_start",
    ), outcome
    assert outcome.reason == "ups launch was stopped by SIGTERM while torchrun was starting"
