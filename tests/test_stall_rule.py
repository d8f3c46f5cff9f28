"""The stall rule of a ``--script`` run as pure logic: which ranks are idle, when the
stacks are asked for, what counts as stalled on gloo and on NCCL, and how the odd rank is
named. No processes (tests/test_stall.py runs the real thing)."""

from __future__ import annotations

import faulthandler
import math
import os
from pathlib import Path

import pytest

from ups import ckpt
from ups.cli import launch as launch_cli
from ups.deploy.hosts import ContainerHost
from ups.deploy.onhost.plan import build_script_plan
from ups.launch.finalize import exit_code, finalize_outcome
from ups.launch.plan import DEFAULT_STALL_TIMEOUT_S, LaunchPlan, LaunchRequest, build_plan
from ups.launch.stall import Stall, _catches
from ups.launch.stallrule import (
    CPU_IDLE_FRACTION,
    IO_IDLE_BYTES,
    RankTrack,
    RuledOut,
    Stacks,
    Stalled,
    StallRule,
    judge,
    locate,
)
from ups.launch.torchrun import TorchrunResult
from ups.outcome import EXIT_STALLED, Outcome
from ups.retry import retry_verdict
from ups.stackdump import (
    DUMP_SIGNAL,
    ENV_HOOKED,
    ENV_STACK_DIR,
    Frame,
    hooked_pids,
    install_hook,
    main_thread,
    parse_dump,
)
from ups.workload import WorkloadError, load_run_file

TORCH = "/venv/lib/python3.11/site-packages/torch"
SLEEP = [Frame("/proj/train.py", 78, "<module>")]
ALL_REDUCE = [
    Frame(f"{TORCH}/distributed/distributed_c10d.py", 3252, "all_reduce"),
    Frame(f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
    Frame("/proj/train.py", 40, "<module>"),
]
BARRIER = [
    Frame(f"{TORCH}/distributed/distributed_c10d.py", 5356, "barrier"),
    Frame(f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
    Frame("/proj/train.py", 90, "<module>"),
]
ITEM = [Frame("/proj/train.py", 55, "train_step"), Frame("/proj/train.py", 99, "<module>")]
"""Where a rank spins on a GPU: in ``loss.item()``, the NCCL all-reduce queued before it."""
EVAL_A = [Frame("/proj/train.py", 120, "evaluate"), Frame("/proj/train.py", 130, "<module>")]
EVAL_B = [Frame("/proj/train.py", 118, "evaluate"), Frame("/proj/train.py", 130, "<module>")]
FILELOCK = [
    Frame("/venv/lib/python3.11/site-packages/filelock/_api.py", 344, "acquire"),
    Frame("/proj/train.py", 12, "<module>"),
]
CWD = Path("/proj")


def _judge(idle: set[int], first: Stacks, second: Stacks, single_node: bool = True) -> object:
    ranks = set(first) | set(second)
    return judge(ranks, idle, first, second, single_node=single_node, cwd=CWD, seconds=31.0)


def test_the_issue_hang_is_stalled_on_gloo_and_on_nccl() -> None:
    """Rank 1 asleep outside any collective. On gloo rank 0 blocks in all_reduce (idle
    too); on NCCL it spins in ``.item()`` (busy, its stack the same in both dumps). Both
    are stalls naming rank 1; on NCCL rank 0 is named as spinning."""
    gloo = _judge({0, 1}, {0: ALL_REDUCE, 1: SLEEP}, {0: ALL_REDUCE, 1: SLEEP})
    assert isinstance(gloo, Stalled) and gloo.odd == (1,) and gloo.spinning == ()
    assert gloo.summary([0, 1]) == (
        "rank 1 at train.py:78, outside any collective; rank 0 in all_reduce at train.py:40"
    )
    nccl = _judge({1}, {0: ITEM, 1: SLEEP}, {0: ITEM, 1: SLEEP})
    assert isinstance(nccl, Stalled) and nccl.odd == (1,) and nccl.spinning == (0,)
    assert nccl.summary([0, 1]).endswith("; rank 0 spinning at train.py:55")


def test_four_ranks_name_the_odd_one_and_group_the_rest() -> None:
    """With 4 ranks the message reads like the issue's: the odd rank, then the others by
    place, torch's wrapper frames skipped for the call the script made."""
    first = {0: ALL_REDUCE, 1: SLEEP, 2: ALL_REDUCE, 3: ALL_REDUCE}
    verdict = _judge({0, 1, 2, 3}, first, first)
    assert isinstance(verdict, Stalled)
    assert verdict.summary([0, 1, 2, 3]) == (
        "rank 1 at train.py:78, outside any collective; ranks 0, 2, 3 in all_reduce at train.py:40"
    )


def test_waiting_for_a_working_rank_is_never_a_stall() -> None:
    """A long evaluation or checkpoint write on rank 0 (its stack moves) while rank 1 waits
    at a barrier (gloo: idle), or on a file lock outside any collective (the datasets
    cache's): ruled out. So is a busy rank that gave no stack: it may be working."""
    barrier = _judge({1}, {0: EVAL_A, 1: BARRIER}, {0: EVAL_B, 1: BARRIER})
    assert isinstance(barrier, RuledOut) and "busy and not stuck" in barrier.why
    lock = _judge({1}, {0: EVAL_A, 1: FILELOCK}, {0: EVAL_B, 1: FILELOCK})
    assert isinstance(lock, RuledOut)
    unknown = _judge({1}, {0: [], 1: SLEEP}, {0: [], 1: SLEEP})
    assert isinstance(unknown, RuledOut)


def test_idle_inside_collectives_is_a_stall_on_one_node_only() -> None:
    """Every rank idle inside a collective (rank 1 in a barrier, the others in an
    all-reduce: a mismatch that can never complete) is a stall on one node, naming the
    minority; on a multi-node run another node may be working: ruled out. A busy rank
    stuck at one place with the idle ones inside collectives is ruled out too."""
    stacks = {0: ALL_REDUCE, 1: BARRIER, 2: ALL_REDUCE}
    one = _judge({0, 1, 2}, stacks, stacks)
    assert isinstance(one, Stalled) and one.odd == (1,) and one.outside == ()
    assert one.summary([0, 1, 2]).startswith("rank 1 in barrier at train.py:90; ranks 0, 2 ")
    assert isinstance(_judge({0, 1, 2}, stacks, stacks, single_node=False), RuledOut)
    spin = _judge({1}, {0: ITEM, 1: BARRIER}, {0: ITEM, 1: BARRIER})
    assert isinstance(spin, RuledOut) and "wait inside a collective" in spin.why


def test_locate_reads_the_scripts_line_and_the_call_it_is_in(tmp_path: Path) -> None:
    """The script's own innermost frame, its source line without the comment, the library
    call it made (public names only), and whether that call waits on peers: collectives,
    DDP's forward, backward (DDP's gradient all-reduce)."""
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(600)  # stuck here\n")
    where = locate([Frame(str(script), 2, "<module>")], tmp_path)
    assert where is not None and where.text == "at train.py:2 (`time.sleep(600)`)"
    assert not where.waits_on_peers
    backward = [
        Frame(f"{TORCH}/autograd/graph.py", 841, "_engine_run_backward"),
        Frame(f"{TORCH}/autograd/__init__.py", 353, "backward"),
        Frame(f"{TORCH}/_tensor.py", 625, "backward"),
        Frame(str(script), 2, "<module>"),
    ]
    where = locate(backward, tmp_path)
    assert where is not None and where.waits_on_peers
    assert where.text.startswith("in backward at train.py:2")
    assert locate([], tmp_path) is None


def _track(now: float, cpu_per_s: float, io_per_s: float = 0.0, since: float = 0.0) -> RankTrack:
    track = RankTrack(first_seen=since, keep_s=60.0)
    t = since
    while t <= now:
        track.add(t, cpu_per_s * (t - since), int(io_per_s * (t - since)))
        t += 1.0
    return track


def test_a_rank_is_idle_without_cpu_io_lines_heartbeats_or_disk_waits() -> None:
    """Below 5 % of a core and 1 MiB over the window, no sampling interval above 5 % of a
    core, no signal inside it; a rank seen for less than the window is never idle."""
    assert _track(30, cpu_per_s=0.001).idle_for(30, 20)
    assert not _track(30, cpu_per_s=CPU_IDLE_FRACTION * 2).idle_for(30, 20)
    assert not _track(30, cpu_per_s=0.0, io_per_s=IO_IDLE_BYTES / 10).idle_for(30, 20)
    assert not _track(30, cpu_per_s=0.0, since=15).idle_for(30, 20)
    burst = _track(28, cpu_per_s=0.0)
    burst.add(29, 0.1, 0)  # a tenth of a second of work a second ago: too little for the
    burst.add(30, 0.1, 0)  # window's average, but the rank was not idle the whole window
    assert not burst.idle_for(30, 20) and burst.idle_for(49.5, 20)
    beating = _track(30, cpu_per_s=0.0)
    beating.signal_at = 25.0
    assert not beating.idle_for(30, 20)
    beating.add(50, 0.0, 0)
    assert beating.idle_for(50, 20)  # the heartbeat is older than the window


def test_the_rule_dumps_at_half_the_timeout_and_decides_at_the_timeout() -> None:
    """A rank idle for T/2 with no progress anywhere: the first dump. At T: the second
    dump and the verdict, the stall's length since the last progress, not before a rank
    that worked until recently has been idle for T as well. Progress in between forgets
    the suspicion; a ruled-out suspicion is judged again T/2 later."""
    dumps: list[str] = []
    stacks = {0: ALL_REDUCE, 1: SLEEP}

    def dump(why: str) -> Stacks:
        dumps.append(why)
        return stacks

    rule = StallRule(20.0, single_node=True, cwd=CWD)
    tracks = {0: _track(100, 0.0), 1: _track(100, 0.0)}
    assert rule.check(100, tracks, last_progress=95, dump=dump) is None and not dumps
    assert rule.check(106, tracks, last_progress=95, dump=dump) is None and len(dumps) == 1
    assert rule.check(110, tracks, last_progress=95, dump=dump) is None and len(dumps) == 1
    verdict = rule.check(116, tracks, last_progress=95, dump=dump)
    assert isinstance(verdict, Stalled) and verdict.seconds == 21 and len(dumps) == 2

    # Rank 0 idle since 80, rank 1 worked until 100: at 110 a verdict would only see rank
    # 0 idle for 20 s; it waits until rank 1 has been idle for the timeout too.
    rule = StallRule(20.0, single_node=True, cwd=CWD)
    late = {0: _track(121, 0.0), 1: _track(100, 1.0)}
    for t in range(101, 122):
        late[1].add(t, 100.0, 0)
    assert rule.check(95, late, -math.inf, dump) is None  # first dump (rank 0 idle 10 s)
    assert rule.check(110, late, -math.inf, dump) is None  # rank 1 idle 10 s: wait
    verdict = rule.check(121, late, -math.inf, dump)
    assert isinstance(verdict, Stalled) and verdict.seconds == 21

    rule = StallRule(20.0, single_node=True, cwd=CWD)
    rule.check(106, tracks, last_progress=95, dump=dump)
    assert rule.episode is not None
    rule.check(107, tracks, last_progress=106.5, dump=dump)  # a line: suspicion forgotten
    assert rule.episode is None

    moving = iter([{0: EVAL_A, 1: BARRIER}, {0: EVAL_B, 1: BARRIER}, {0: EVAL_A, 1: BARRIER}])
    rule = StallRule(20.0, single_node=True, cwd=CWD)
    busy = {0: _track(200, 1.0), 1: _track(200, 0.0)}
    assert rule.check(180, busy, -math.inf, lambda _: next(moving)) is None
    assert isinstance(rule.check(190, busy, -math.inf, lambda _: next(moving)), RuledOut)
    assert rule.check(195, busy, -math.inf, lambda _: next(moving)) is None  # not yet
    assert isinstance(rule.check(200, busy, -math.inf, lambda _: next(moving)), RuledOut)


def test_the_hook_writes_its_header_once_and_the_dump_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a rank (RANK and UPS_STACK_DIR set) the hook writes the header ups looks for and
    catches the dump signal, which writes this thread's stack into the file; the
    environment it marked makes a child skip it. Outside a rank it does nothing."""
    environ = {"RANK": "3", ENV_STACK_DIR: str(tmp_path)}
    try:
        path = install_hook(environ)
        assert path == tmp_path / "rank3.txt" and environ[ENV_HOOKED] == str(os.getpid())
        assert hooked_pids(path.read_text()) == {os.getpid(): int(DUMP_SIGNAL)}
        assert _catches(os.getpid(), int(DUMP_SIGNAL))
        assert install_hook(environ) is None  # a child inherits the mark
        os.kill(os.getpid(), DUMP_SIGNAL)  # the handler writes at once, from C
        frames = main_thread(parse_dump(path.read_text()))
        assert frames and frames[0].func.startswith("test_the_hook")
    finally:
        faulthandler.unregister(DUMP_SIGNAL)
    assert not _catches(os.getpid(), int(DUMP_SIGNAL))
    assert install_hook({ENV_STACK_DIR: str(tmp_path)}) is None


def test_a_script_plan_watches_by_default_and_the_trainer_never(tmp_path: Path) -> None:
    """A script run is watched (300 s) with the hook first on the ranks' PYTHONPATH (the
    user's own kept after it); 0 turns it off; the trainer refuses the flag; a negative
    timeout is a flag error."""

    def plan(req: LaunchRequest, environ: dict[str, str] | None = None) -> LaunchPlan:
        return build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ=environ or {})

    req = LaunchRequest(script="train.py", output_dir=str(tmp_path), run_id="r")
    watched = plan(req, {"PYTHONPATH": "/mine"})
    assert watched.stall_timeout_s == DEFAULT_STALL_TIMEOUT_S
    hook, mine = watched.env["PYTHONPATH"].split(os.pathsep)
    assert hook.endswith("torchelastic/node0-stackhook") and mine == "/mine"
    assert watched.env[ENV_STACK_DIR] == str((tmp_path / "r" / "stacks").absolute())
    off = plan(LaunchRequest(script="train.py", output_dir=str(tmp_path), stall_timeout_s=0))
    assert off.stall_timeout_s is None and "PYTHONPATH" not in off.env
    with pytest.raises(ValueError, match="--stall-timeout watches a --script run"):
        LaunchRequest(config_path="c.yaml", stall_timeout_s=30)
    for wrong in (-1, math.nan, math.inf):
        with pytest.raises(ValueError, match="--stall-timeout must be 0"):
            LaunchRequest(script="train.py", stall_timeout_s=wrong)


def test_the_run_files_timeout_reaches_launch_and_every_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stall_timeout_s`` in a run file: `ups launch --run-file` uses it, the flag beats
    it, and a deploy's host run file carries it (fab deploy, Slurm, Vast and compose all
    start ``ups launch --run-file``); a negative one is a run-file problem."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    run_file = proj / "ups-run.yaml"
    run_file.write_text("script: train.py\nstall_timeout_s: 45\n")
    cwd = Path.cwd()
    try:
        argv = ["--run-file", str(run_file), "--output-dir", str(tmp_path), "--dry-run"]
        assert launch_cli.main(argv) == 0
        assert '"stall_timeout_s": 45.0' in capsys.readouterr().out
        assert launch_cli.main([*argv, "--stall-timeout", "0"]) == 0
        assert '"stall_timeout_s": null' in capsys.readouterr().out
    finally:
        os.chdir(cwd)
    workload = load_run_file(run_file, environ={})
    spec = ContainerHost(name="h", host="127.0.0.1", workdir="/w", ups_bin="ups")
    host = build_script_plan(spec, workload, run_id="r1", env={})
    assert host.run_file is not None and host.run_file["stall_timeout_s"] == 45
    run_file.write_text("script: train.py\nstall_timeout_s: -3\n")
    with pytest.raises(WorkloadError, match="stall_timeout_s: Input should be greater"):
        load_run_file(run_file, environ={})


def test_a_stall_is_failed_124_not_retried_and_names_the_rank(tmp_path: Path) -> None:
    """The outcome of a stall ends the run ``failed``, cause ``stalled``, exit 124 whatever
    torchrun exited with; it names the odd rank and its stack file, says how to resume;
    the retry table never resumes or restarts it (a managed run rents no next offer)."""
    req = LaunchRequest(script="train.py", output_dir=str(tmp_path), run_id="r")
    plan = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})
    stall = Stall(
        seconds=31.4, timeout_s=30, odd_ranks=[1], summary="rank 1 at train.py:78", stacks="s"
    )
    result = TorchrunResult(rc=1, status="failed", stall=stall, phase="script")
    outcome = finalize_outcome(plan, result)
    assert (outcome.outcome, outcome.cause, outcome.exit_code) == ("failed", "stalled", 124)
    assert outcome.failed_rank == 1 and outcome.traceback == "s/rank1.txt"
    assert outcome.reason.startswith(
        "stalled: no rank made progress for 31 s (stall timeout 30 s): rank 1 at train.py:78."
    )
    assert "continue it with the same command and `--run-id r`" in outcome.reason
    assert exit_code(outcome, torchrun_rc=1) == EXIT_STALLED
    assert retry_verdict(outcome)[0] is False
    assert retry_verdict(None, EXIT_STALLED)[0] is False
    bare = Outcome(run_id="r", outcome="failed", exit_code=EXIT_STALLED, reason="x")
    assert retry_verdict(bare)[0] is False


def test_every_ckpt_call_is_a_heartbeat_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ckpt.progress(step)`` writes the rank's heartbeat file with the step; calls within
    a second write nothing; ``should_stop`` beats too; without UPS_PROGRESS_DIR nothing is
    written."""
    monkeypatch.setenv(ckpt.ENV_PROGRESS, str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setattr(ckpt, "_beat_at", -math.inf)
    monkeypatch.setattr(ckpt, "_beat_step", None)
    ckpt.progress(7)
    beat = tmp_path / "rank2"
    assert beat.read_text() == "7\n"
    ckpt.progress(8)
    assert beat.read_text() == "7\n"  # within the second
    monkeypatch.setattr(ckpt, "_beat_at", -math.inf)
    monkeypatch.setattr(ckpt, "_handler_installed", True)  # no SIGTERM handler in pytest
    ckpt.should_stop()
    assert beat.read_text() == "8\n"
    monkeypatch.delenv(ckpt.ENV_PROGRESS)
    monkeypatch.setattr(ckpt, "_beat_at", -math.inf)
    beat.unlink()
    ckpt.progress(9)
    assert not beat.exists()
