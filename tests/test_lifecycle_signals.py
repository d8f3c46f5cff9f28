"""A signal at any phase of `ups launch` ends every process the run started, and the
outcome names the phase (during training: tests/test_lifecycle_preempt.py)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import parse_events
from tests.launch_helpers import ALLREDUCE, write_script
from tests.lifecycle_helpers import assert_no_survivors, finish, outcome, start, wait_for

pytestmark = pytest.mark.slow


def _wait_for_children(proc: psutil.Process, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(proc.children(recursive=True)) >= n:
            return
        time.sleep(0.1)  # watching another process's children appear
    raise AssertionError(f"launch never had {n} child processes")


def test_sigterm_during_the_preflight_allreduce_leaves_no_worker_behind(tmp_path: Path) -> None:
    """SIGTERM (what `docker stop` sends) while preflight's all-reduce workers run: exit 143
    (128 + SIGTERM), outcome "failed" in phase preflight saying so, torchrun never started,
    and the all-reduce workers are gone with launch (they used to outlive it)."""
    script = write_script(tmp_path, "ok.py", ALLREDUCE)
    run_dir = tmp_path / "runs" / "p"
    proc = start(str(tmp_path), "--script", str(script), "--run-id", "p",
                 "--output-dir", str(tmp_path / "runs"))  # fmt: skip
    _wait_for_children(psutil.Process(proc.pid), 2, timeout=120)  # the check's 2 workers
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert_no_survivors(str(tmp_path))
    out_json = outcome(run_dir)
    assert (out_json["outcome"], out_json["phase"], out_json["cause"]) == (
        "failed",
        "preflight",
        "stopped",
    ), out_json
    assert "during preflight" in out_json["reason"], out_json["reason"]
    events = [e["event"] for e in parse_events((run_dir / "logs" / "launch.log").read_text())]
    assert "torchrun_starting" not in events, events
    assert not list(run_dir.glob("torchelastic/*")), "torchrun started after the stop"


@pytest.mark.parametrize(
    ("phase_event", "phases"),
    [
        ({"event": "torchrun_starting"}, {"torchrun_start", "data_check", "init", "training",
                                          "final_save"}),
        ({"event": "phase", "phase": "data_check"}, {"data_check", "init", "training",
                                                     "final_save"}),
    ],
    ids=["torchrun-start", "data-check"],
)  # fmt: skip
def test_sigterm_at_a_phase_ends_every_process_and_names_it(
    make_config: Callable[..., Path],
    tmp_path: Path,
    phase_event: dict[str, str],
    phases: set[str],
) -> None:
    """SIGTERM as torchrun starts or during the data check: launch ends (75 preempted, or
    143 when the workers had not installed their handler yet), the outcome names a phase of
    that moment, and no process survives. SIGTERM during training is
    test_lifecycle_preempt's first test (75, phase final_save, no process survives)."""
    cfg = make_config(training={"max_steps": 100_000, "epochs": 1000})
    log = tmp_path / "runs" / "latest" / "logs" / "launch.log"
    proc = start(str(tmp_path), str(cfg), "--skip-preflight")
    wait_for(log, proc, 240, **phase_event)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=300)
    assert proc.returncode in (75, 143), out[-3000:]
    assert_no_survivors(str(tmp_path))
    result = outcome((tmp_path / "runs" / "latest").resolve())
    assert result["phase"] in phases, result
    assert result["outcome"] in ("preempted", "failed")


def test_a_second_stop_signal_inside_a_log_write_is_no_crash(tmp_path: Path) -> None:
    """launch.log is written through one buffered file. A stop signal that lands while the
    main thread is inside a write to it (here: a line blocked on a full pipe, as a slow
    disk or a second signal during the first one's line would hold it) must not write from
    its handler into that same file, which raises `reentrant call inside BufferedWriter`
    and killed a node's launcher on Slurm. Both signals' lines come out after the line
    that was being written, whole."""
    import os
    import subprocess
    import threading

    from ups.launch.tee import LineTee
    from ups.launch.torchrun import _forward_signals
    from ups.log import setup_logging

    fifo = tmp_path / "launch.log"
    os.mkfifo(fifo)
    read_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the tee can open
    out = open(os.devnull, "w")  # noqa: SIM115 - closed below
    tee = LineTee(fifo, out, render=False)
    setup_logging(run_id="fifo", console=False, stdout=tee)  # type: ignore[arg-type]
    child = subprocess.Popen(["sleep", "60"])
    received: list[bytes] = []

    def signals_then_drain() -> None:
        time.sleep(0.5)  # the main thread is now blocked inside the big line's write
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                chunk = b""
            received.append(chunk)
            if b"stop_signal_repeated" in b"".join(received):
                return
            time.sleep(0.05)

    drainer = threading.Thread(target=signals_then_drain)
    big = "x" * (1 << 20)  # far more than a pipe holds: the write blocks until drained
    # Should the block end early (the failure this test is for), a late signal is ignored
    # rather than ending pytest.
    outer = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        with _forward_signals(child, {}, tmp_path / "stop_request"):
            drainer.start()
            tee.write_line(big)
            drainer.join(timeout=30)
    finally:
        if drainer.is_alive():
            drainer.join(timeout=30)  # its signals land before the outer handler goes back
        child.kill()
        child.wait()
        tee.close()
        out.close()
        os.close(read_end)
        setup_logging(console=False)
        signal.signal(signal.SIGTERM, outer)
    text = b"".join(received).decode()
    lines = text.splitlines()
    assert lines[0] == big
    events = [line for line in lines[1:] if line.startswith("{")]
    assert ['"stop_signal_received"' in events[0], '"stop_signal_repeated"' in events[1]] == [
        True,
        True,
    ], events
