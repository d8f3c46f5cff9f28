"""What the console view draws from a run's JSON lines, and transfer progress (no processes)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import structlog

from ups.console import ConsoleView, render_line, short
from ups.deploy.transport.progress import Progress
from ups.log import get_logger, setup_logging
from ups.preflight.result import CheckResult, Report, Status

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # a StringIO has no size; rich reads COLUMNS


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _line(event: str, level: str = "info", **fields: Any) -> str:
    return json.dumps({"event": event, "level": level, "rank": 0, **fields})


RUN = [
    _line("train_start", steps=4, from_step=0),
    _line("train_step", step=0, **{"train/loss": 0.5, "train/advection/rel_l2": 0.6}),
    _line("step_skipped", "warning", reason="out of memory on rank(s) [1]", step=1),
    _line("checkpoint_saved", path="/runs/r/checkpoints/step_000002.pt", step=2),
    _line("train_step", step=3, **{"train/loss": 0.123456789, "train/advection/rel_l2":
          0.0987654321, "train/samples_per_s": 476.5154338341, "train/lr": 0.00030000000000000003}),
    "a plain line from torchrun",
    _line("eval", **{"eval/advection/rel_l2": 0.05, "eval/advection/baseline_rel_l2": 0.2,
          "eval/advection/samples": 12.0}),
    _line("outcome", outcome="finished", reason="all 2 rank(s) finished 4 steps", exit_code=0),
    _line("run_ended", text="run finished", outcome="finished",
          reason="all 2 rank(s) finished 4 steps", run_dir="/runs/r", exit_code=0, run_id="r"),
]  # fmt: skip


def _draw(lines: list[str]) -> str:
    out = Tty()
    view = ConsoleView(out, live=True)
    for line in lines:
        view.feed(line)
    view.close()
    return ANSI.sub("", out.getvalue()).replace("\r", "\n")


def test_view_draws_progress_warnings_and_tables_with_short_numbers() -> None:
    """A person sees, in the live line's last frame, step/total, short loss and lr, the
    skipped step as a warning line and in the count, the last checkpoint; plain lines
    untouched; then both tables."""
    seen = _draw(RUN)
    assert "4/4" in seen and "ETA" in seen
    assert "loss 0.1235 (advection 0.09877)" in seen and "lr 0.0003" in seen
    assert "476.5 samples/s" in seen and "ckpt @2" in seen and "1 skipped" in seen
    assert "warning step_skipped" in seen and "a plain line from torchrun" in seen
    assert re.search(r"advection +│ +0\.0500 │ +0\.2000 │ +4\.0x │ +12", seen)
    assert re.search(r"outcome +│ finished \(exit 0\)", seen)
    assert "4/4, 1 skipped" in seen and "1 warning(s)" in seen
    assert "0.123456789" not in seen and "00030000000000000003" not in seen


def test_a_stop_is_one_story_without_torchruns_lines_or_warnings() -> None:
    """Ctrl-C: launch's line and rank 0's "stop requested (SIGINT)" as information, rank
    1's repeats and torchrun's own log lines left out (launch.log has them), no warning
    counted, and the live line ends on the step the table shows (5, not the last logged 3)."""
    stop = [
        _line("train_start", steps=8, from_step=0),
        _line("train_step", step=2, **{"train/loss": 0.5}),
        json.dumps({"event": "stop_signal_received", "level": "warning", "signal": "SIGINT",
                    "text": "SIGINT (Ctrl-C) received: the workers stop at the next step",
                    "forwarded": "SIGTERM to torchrun", "node_rank": 0}),
        "W1125 22:23:31.045000 29738 torch/distributed/elastic/agent/server/api.py:753] "
        "Received 15 death signal, shutting down workers",
        _line("preempt_stop", "warning", step=5, signal="SIGINT"),
        json.dumps({"event": "preempt_stop", "level": "warning", "rank": 1, "step": 5,
                    "signal": "SIGINT"}),
        _line("checkpoint_saved", path="/runs/r/checkpoints/step_000005.pt", step=5),
        _line("outcome", "warning", outcome="preempted", step=5, exit_code=75,
              reason="SIGINT received; all ranks stopped after step 5"),
        _line("run_ended", "warning", text="run preempted", outcome="preempted", exit_code=75,
              reason="SIGINT (Ctrl-C) received by ups launch; all ranks stopped after step 5"),
    ]  # fmt: skip
    seen = _draw(stop)
    assert "api.py" not in seen and "SIGTERM" not in seen and "warning" not in seen, seen
    assert seen.count("stop requested (SIGINT): all ranks stop after step 5") == 1
    assert re.findall(r"(\d+/8) +\d+%", seen)[-1] == "5/8" and "5/8, 0 skipped" in seen


def test_standalone_trainer_summary_comes_on_close() -> None:
    """Without a launcher (ups-train by hand), the outcome table is printed when the view
    closes at exit."""
    seen = _draw([*RUN[:5], RUN[7]])
    assert re.search(r"outcome +│ finished \(exit 0\)", seen)


def test_plain_mode_is_one_key_value_line_per_event() -> None:
    """Off a terminal (`fab logs > file`) each event is one line with short numbers and
    non-JSON lines pass through unchanged."""
    out = io.StringIO()
    view = ConsoleView(out)
    for line in [RUN[0], RUN[4], RUN[5]]:
        view.feed(line)
    lines = out.getvalue().splitlines()
    assert lines[0] == "train_start  steps=4  from_step=0"
    assert "train/loss=0.1235" in lines[1] and "train/lr=0.0003" in lines[1]
    assert lines[2] == "a plain line from torchrun"
    assert render_line("not json") == "not json"


def test_an_event_with_a_sentence_shows_the_sentence_not_its_name() -> None:
    """People read the sentence an event carries (``text``); its identifier, for filtering
    the log, is not printed, and neither is the sentence twice."""
    line = _line(
        "master_port_switched", text="master port switched", port=29501, previous_port=29500
    )
    assert render_line(line) == "master port switched  port=29501  previous_port=29500"
    warning = _line("preflight_skipped", "warning", text="preflight skipped (--skip-preflight)")
    assert render_line(warning) == "warning preflight skipped (--skip-preflight)"
    assert "train_start  steps=4" in render_line(RUN[0])  # no sentence: the name


def test_short_numbers() -> None:
    """Floats show 4 significant digits; big rates whole; ints and strings unchanged."""
    assert [short(x) for x in (0.00030000000000000003, 476.5154, 12345.6, 3, "NaN", 0.0)] == [
        "0.0003", "476.5", "12346", "3", "NaN", "0",
    ]  # fmt: skip


def test_preflight_report_is_one_table_plain_or_coloured() -> None:
    """The same rich table reads as plain aligned text in files and in colour on a terminal."""
    report = Report(results=[
        CheckResult(name="ports", status=Status.FAIL, message="29500 taken", hint="--master-port"),
        CheckResult(name="disk", status=Status.PASS, message="ok", value=69.12345, unit="GiB"),
    ])  # fmt: skip
    plain = report.render_table()
    assert re.search(r"^ports +FAIL +- +29500 taken$", plain, re.M)
    assert re.search(r"^disk +PASS +69\.1 GiB +ok$", plain, re.M)
    assert "\x1b[" not in plain and "preflight NOT OK" in plain
    out = Tty()
    ConsoleView(out, live=True).show(report.renderable())
    assert "\x1b[" in out.getvalue() and "How to fix:" in ANSI.sub("", out.getvalue())


def test_transfer_progress_shows_bytes_rate_and_eta() -> None:
    """On a terminal a transfer shows bytes done/total, the rate and the ETA; it ends (and
    off a terminal only shows) one summary line with the size and rate."""
    out = Tty()
    progress = Progress("upload ups.whl", 4 << 20, out)
    for _ in range(4):
        progress.update(1 << 20)
    progress.close()
    shown = ANSI.sub("", out.getvalue())
    assert "upload ups.whl" in shown and "ETA" in shown and "MiB" in shown
    assert re.search(r"upload ups\.whl 4 MiB in [\d.]+ s \([\d.]+ \w+/s\)\n$", shown)
    plain = io.StringIO()
    quiet = Progress("fetch r", None, plain)
    quiet.update(1536)
    quiet.close()
    assert re.fullmatch(r"fetch r 1\.5 KiB in [\d.]+ s \([\d.]+ \w+/s\)\n", plain.getvalue())


def test_trainer_console_renders_stdout_and_keeps_the_rank_file_json(tmp_path: Path) -> None:
    """`ups-train --log-format console`: stdout shows the live line and the outcome table,
    while logs/rank0.jsonl still gets every event as a strict JSON line."""
    out = Tty()
    try:
        path = setup_logging(log_dir=tmp_path, console=True, live=True, stdout=out)
        log = get_logger()
        log.info("train_start", steps=2, from_step=0)
        log.info("train_step", step=1, **{"train/loss": 0.123456789})
        log.warning("checkpoint_corrupt", path="x.pt")
        log.info("outcome", outcome="finished", reason="done", exit_code=0)
        setup_logging(console=False, stdout=io.StringIO())  # closes the old view
    finally:
        structlog.reset_defaults()
    shown = ANSI.sub("", out.getvalue())
    assert "2/2" in shown and "loss 0.1235" in shown and "checkpoint_corrupt" in shown
    assert re.search(r"outcome +│ finished \(exit 0\)", shown)
    assert path is not None
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "train_start", "train_step", "checkpoint_corrupt", "outcome",
    ]  # fmt: skip
    assert events[1]["train/loss"] == 0.123456789
