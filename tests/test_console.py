"""The console people see on a terminal, and the JSON lines everything else gets.

The terminal tests run the real `ups launch` (2 gloo ranks under torchrun) inside a real
pseudo-terminal and read back what it drew; the piped test reads what the shared finished
run (tests/lifecycle_helpers.py: finished_launch) printed to a pipe.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, worker_env
from tests.lifecycle_helpers import finished_launch

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]")
FLOAT = re.compile(r"\d*\.\d+(?:e[-+]?\d+)?")


def run_in_pty(argv: list[str], *, columns: int = 120, timeout: float = 300) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr; return (exit code, text).

    The text is what was drawn with escape codes removed and carriage returns as line
    breaks, so every frame of the live line is kept (none may show a long float).
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child: size the terminal before anything asks for it, then exec
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        env = {**worker_env(), "TERM": "xterm-256color"}
        env.pop("COLUMNS", None)
        os.chdir(REPO)
        os.execvpe(argv[0], argv, env)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.killpg(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    return os.waitstatus_to_exitcode(status), ANSI.sub("", text).replace("\r", "\n")


def long_floats(text: str) -> list[str]:
    """Numbers shown with more than 6 significant digits (raw float reprs)."""
    found = []
    for match in FLOAT.finditer(text):
        mantissa = match.group().split("e")[0].replace(".", "").lstrip("0")
        if len(mantissa) > 6:
            found.append(match.group())
    return found


def strict_json(line: str) -> object:
    def reject(name: str) -> object:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=reject)


@pytest.mark.slow
def test_launch_on_a_terminal_shows_progress_and_summary_and_its_log_stays_json(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """On a terminal `ups launch` draws the live progress line (step/total, ETA, short
    numbers) and ends with the evaluation and outcome tables, with no raw float and no JSON;
    launch.log stays JSON."""
    config = make_config(training={"max_steps": 6, "log_every": 1}, wandb={"mode": "disabled"})
    cmd = [PYTHON, "-m", "ups", "launch", str(config), "--skip-preflight"]

    code, seen = run_in_pty([*cmd, "--run-id", "tty"])
    assert code == 0, seen[-3000:]
    assert re.search(r"train .* 6/6 +100% .*ETA", seen), seen[-3000:]
    assert re.search(r"loss \d\.\d{1,4} \(advection \d\.\d{1,4} darcy \d\.\d{1,4}\)", seen)
    assert "samples/s" in seen and "lr " in seen and "0 skipped" in seen
    assert "held-out evaluation" in seen and "baseline rel L2" in seen
    assert re.search(r"outcome +│ finished \(exit 0\)", seen), seen[-3000:]
    assert re.search(r"steps +│ 6/6, 0 skipped", seen)
    assert "preflight skipped" in seen  # a warning, printed above the live line
    assert long_floats(seen) == [], long_floats(seen)
    assert '{"' not in seen  # no raw JSON event reached the terminal
    launch_log = tmp_path / "runs" / "tty" / "logs" / "launch.log"
    events = [strict_json(line) for line in launch_log.read_text().splitlines()]
    assert any(isinstance(e, dict) and e["event"] == "train_step" for e in events)


@pytest.mark.slow
def test_a_piped_launch_prints_only_strict_json_lines(
    tiny_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`ups launch` with stdout a pipe (the shared finished run, :func:`finished_launch`)
    prints only strict JSON lines, the last one `run_ended`."""
    launched = finished_launch(tmp_path_factory, tiny_data)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-2000:]
    lines = launched.stdout.splitlines()
    parsed = [strict_json(line) for line in lines]  # raises on any non-JSON line
    names = [e["event"] for e in parsed if isinstance(e, dict)]
    assert len(names) == len(lines) and "train_step" in names and names[-1] == "run_ended"


@pytest.mark.slow
def test_log_format_json_on_a_terminal_prints_json_lines(
    make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """`--log-format json` keeps a terminal's output machine-readable: every line is JSON."""
    config = make_config(training={"max_steps": 2, "log_every": 1}, wandb={"mode": "disabled"})
    code, seen = run_in_pty(
        [PYTHON, "-m", "ups", "launch", str(config), "--skip-preflight", "--log-format", "json"]
    )
    assert code == 0, seen[-3000:]
    lines = [line for line in seen.splitlines() if line.strip()]
    assert lines and all(isinstance(strict_json(line), dict) for line in lines), seen[-2000:]
