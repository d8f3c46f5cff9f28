"""Other people's scripts under ``ups launch --script``, and a stop by Ctrl-C, told truthfully.

The scripts here are plain: no ``@record``, so torchrun leaves no error file and only what
the rank printed names its exception. That each rank's output reaches the console and
launch.log whole lines at a time, even with ``print()`` (two writes per line), is
test_launch_run's (on its successful script run), and so is the hint after a script's rank
dies by a signal (on its SIGSEGV run).
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, parse_events, worker_env
from tests.launch_helpers import (
    events_named,
    launch_cmd,
    outcome_of,
    run_launch,
    wait_for_event,
    write_script,
)
from tests.repo_scripts import captures
from ups.launch import finalize
from ups.launch.ranklogs import printed_exception

PLAIN_RAISE_ON_RANK1 = """
import torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "is up")
if dist.get_rank() == 1:
    raise RuntimeError("boom on rank 1")
dist.barrier()
"""


def _script_run(tmp_path: Path, body: str, *script_args: str) -> subprocess.CompletedProcess[str]:
    script = write_script(tmp_path, "script.py", body)
    return run_launch(
        "--script", str(script), "--output-dir", str(tmp_path / "runs"), "--skip-preflight",
        "--", *script_args,
    )  # fmt: skip


@pytest.mark.slow
def test_plain_script_exception_is_named_from_what_the_rank_printed(tmp_path: Path) -> None:
    """Rank 1 raises in a script without @record: the outcome names RuntimeError and its
    message, the failed rank, phase ``script``, and a traceback file that holds it; the
    end line promises no checkpoint."""
    result = _script_run(tmp_path, PLAIN_RAISE_ON_RANK1)
    assert result.returncode == 1, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "latest"
    outcome = outcome_of(run_dir)
    assert outcome["reason"] == "rank 1 exited with code 1: RuntimeError: boom on rank 1"
    assert (outcome["failed_rank"], outcome["cause"], outcome["phase"]) == (
        1,
        "exception",
        "script",
    )
    assert "RuntimeError: boom on rank 1" in Path(outcome["traceback"]).read_text()
    log_lines = (run_dir / "logs" / "launch.log").read_text().splitlines()
    assert "[rank1]: RuntimeError: boom on rank 1" in log_lines
    assert {"rank 0 is up", "rank 1 is up"} <= set(log_lines)
    end = parse_events(result.stdout)[-1]
    assert (end["event"], end["outcome"]) == ("run_ended", "failed") and "resume" not in end


def test_printed_exception_reads_the_last_traceback() -> None:
    """The exception line after the frames of the last traceback, with or without torch's
    ``[rankN]:`` prefix; chained exceptions name the last one; no traceback, no name."""
    plain = ["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: bad"]
    assert printed_exception(plain) == "ValueError: bad"
    prefixed = [f"[rank3]: {line}" for line in plain]
    assert printed_exception(["noise", *prefixed]) == "ValueError: bad"
    chained = [
        *plain,
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "y.py", line 2, in f',
        "    raise KeyError('k')",
        "    ^^^^^^^^^^^^^^^^^^^",
        "KeyError: 'k'",
    ]
    assert printed_exception(chained) == "KeyError: 'k'"
    assert printed_exception(["W1124 a torch warning", "done"]) is None


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.slow
def test_ctrl_c_is_named_sigint_with_one_step_number(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """SIGINT to `ups launch` (what Ctrl-C sends) while the run is held at step 3: exit 75,
    preempted; the outcome names SIGINT, and its reason, its step and the checkpoint file
    agree on one step number. The console tells it as one story: SIGINT everywhere (the
    ranks' lines too, though torchrun forwarded SIGTERM), no torchrun log line (those are
    in launch.log), no warning counted, and the live line ends on the table's step."""
    config = make_config(training={"epochs": 200, "log_every": 1})
    console = tmp_path / "console.txt"
    with console.open("w") as out:
        proc = subprocess.Popen(
            launch_cmd(str(config), "--skip-preflight", "--log-format", "console"),
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, text=True,
            env=worker_env({"COLUMNS": "200", "UPS_FAULTS": "pause@0:3,pause@1:3"}),
        )  # fmt: skip
        try:
            run_dir = tmp_path / "runs" / "latest"
            log = run_dir / "logs" / "launch.log"
            wait_for_event(log, "fault_injected", proc, timeout=180)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rc == 75
    outcome = outcome_of(run_dir)
    step = outcome["step"]
    assert outcome["outcome"] == "preempted" and outcome["signal"] == "SIGINT"
    assert outcome["reason"].startswith(
        f"SIGINT (Ctrl-C) received by ups launch; all ranks stopped after step {step};"
    ), outcome["reason"]
    assert Path(outcome["checkpoint"]).name == f"step_{step:06d}.pt"
    assert "SIGTERM" not in outcome["reason"]

    seen = ANSI.sub("", console.read_text()).replace("\r", "\n")
    assert (
        "SIGTERM" not in seen
        and f"stop requested (SIGINT): all ranks stop after step {step}" in seen
    )
    assert "api.py:" not in seen and "api.py:" in log.read_text()  # torchrun's own lines
    # --skip-preflight and the drill's fault events are the only warnings; the stop adds none.
    warnings = [line for line in seen.splitlines() if " warning " in f" {line}"]
    assert all("fault" in line or "preflight skipped" in line for line in warnings), warnings
    assert f"│ {len(warnings)} warning(s), 0 error(s) above" in seen, seen[-3000:]
    progress = re.findall(r"(\d+)/(\d+) +\d+%", seen)
    table = re.search(r"steps +│ (\d+)/(\d+), 0 skipped", seen)
    assert progress and table, seen[-3000:]
    assert progress[-1] == table.groups() and int(table[1]) == step, (progress[-3:], table[0])
    # The docs' Ctrl-C capture tells the same story (scripts/captures.py stop makes it).
    assert captures().check("stop", seen) == [], (
        "the docs' Ctrl-C capture is not what ups prints: "
        "run `.venv/bin/python scripts/captures.py stop`"
    )
    for rank in (0, 1):
        stops = [e for e in parse_events((run_dir / "logs" / f"rank{rank}.jsonl").read_text())
                 if e["event"] == "preempt_stop"]  # fmt: skip
        assert [e["signal"] for e in stops] == ["SIGINT"], rank


STOPPABLE = """
import os, signal, sys, time
from ups import ckpt

mode, rank = sys.argv[1], os.environ["RANK"]
if mode == "finish":  # no process group, ever: two copies training alone
    print(f"rank {rank} resumes from {ckpt.resume_path()}", flush=True)
    sys.exit(0)
def leave(signum, frame):
    print(f"rank {rank}: stopping without saving", file=sys.stderr, flush=True)
    os._exit(3)
ckpt.should_stop()  # the contract's handler ("save")
if mode == "exit":  # a handler of its own that leaves without saving
    signal.signal(signal.SIGTERM, leave)
print(f"rank {rank} ready", flush=True)
while not ckpt.should_stop():
    time.sleep(0.05)
if ckpt.is_rank0():
    tmp = ckpt.checkpoint_dir() / "snapshot.pt.tmp"
    tmp.write_text("weights")
    ckpt.commit(tmp)
"""


def _launch_until_ready_then_stop(script: Path, out: Path, mode: str) -> tuple[int, str]:
    """`ups launch --script S -- MODE`, SIGTERM once both ranks are ready; (rc, stdout)."""
    proc = subprocess.Popen(
        launch_cmd("--script", str(script), "--output-dir", str(out), "--skip-preflight",
                   "--", mode),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True, env=worker_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if sum("ready" in s and s.startswith("rank ") for s in seen) == 2:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(seen) + rest


@pytest.mark.slow
def test_a_scripts_stop_is_told_from_its_ranks_exit_codes_and_the_run_continues(
    tmp_path: Path,
) -> None:
    """One torch-free script, one run id, three launches. A SIGTERM handler that exits 3
    without saving: failed (143), rank 0 and its code and last line named, never "exited
    0". The same command with the contract's handler: the run continues (no checkpoint:
    from the start, said so), saves and exits 0: preempted (75), naming the checkpoint.
    Again: UPS_RESUME is that checkpoint; the two ranks never formed a process group, so the
    finished run carries the warning."""
    script = write_script(tmp_path, "stoppable.py", STOPPABLE)
    out = tmp_path / "runs"
    run_dir = out / "latest"

    rc, said = _launch_until_ready_then_stop(script, out, "exit")
    assert rc == 143, said[-3000:]
    assert (
        "SIGTERM sent to the script's ranks; they have 120 s (stop_grace_s) to save and exit"
        in said
    )
    assert "stop at the next step and save" not in said
    failed = outcome_of(run_dir)
    assert (failed["outcome"], failed["cause"], failed["failed_rank"]) == ("failed", "stopped", 0)
    assert failed["reason"].startswith(
        "SIGTERM received by ups launch; rank 0 exited with code 3 after the stop; its last "
        "line on stderr: 'rank 0: stopping without saving'"
    ), failed["reason"]
    run_id = failed["run_id"]

    rc, said = _launch_until_ready_then_stop(script, out, "save")
    assert rc == 75, said[-3000:]
    resuming = events_named(said, "resuming_run")
    assert [e["run_id"] for e in resuming] == [run_id]
    assert resuming[0]["text"] == (
        f"resuming run {run_id}: no committed checkpoint, so the script starts from its beginning"
    )
    assert resuming[0]["why"] == failed["reason"]
    preempted = outcome_of(run_dir)
    saved = str((out / run_id / "checkpoints" / "snapshot.pt").resolve())
    assert preempted["outcome"] == "preempted" and preempted["run_id"] == run_id
    assert preempted["reason"].endswith(
        f"exited 0 after the stop; they committed checkpoint {saved}"
    )

    done = run_launch("--script", str(script), "--output-dir", str(out), "--skip-preflight",
                      "--", "finish")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"rank 0 resumes from {saved}" in done.stdout
    finished = outcome_of(run_dir)
    assert finished["run_id"] == run_id and finished["resumed_from"]["checkpoint"] == saved
    assert finished["warnings"] == [finalize.never_met(2)]
    assert [e["text"] for e in events_named(done.stdout, "run_warning")] == [finalize.never_met(2)]
