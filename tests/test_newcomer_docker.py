"""The README's compose commands for people: `docker compose run` gives the container a
terminal when the caller has one, so ups renders the preflight table, the progress line
and the evaluation and outcome tables; piped, the same commands print JSON lines.

Runs the real image on the real engine, with a short config (the README's commands with
the documented UPS_CONFIG / UPS_*_DIR variables), under a project name of its own.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import demo_data, free_port

REPO = Path(__file__).resolve().parents[1]
COMPOSE = ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker/compose.cpu.yml"]

__all__ = ["demo_data"]  # fixture used by name below


def readme_people_commands() -> list[str]:
    """The `run` commands of the README's "On a terminal" compose block, in order."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- compose-for-people -->", 1)[1].split("```bash\n", 1)[1]
    return [line.split("  #")[0].strip() for line in block.split("```")[0].splitlines() if line]


def _on_a_terminal(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr, 118 columns wide."""
    main, child = pty.openpty()
    os.set_blocking(main, False)
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 118, 0, 0))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=child, stdout=child, stderr=child)
    os.close(child)
    out = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other side closed
                chunk = b""
            out += chunk
            if not chunk and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
    os.close(main)
    # Colours and cursor moves are what a terminal interprets; the text is what is read.
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    return proc.wait(timeout=30), text


@pytest.mark.slow
@pytest.mark.docker
def test_compose_for_people_on_a_terminal_and_json_off_one(
    ups_image: str, demo_data: Path, tmp_path: Path
) -> None:
    """On a terminal: the preflight table, the progress line, the evaluation and outcome
    tables, no JSON line; training piped: JSON lines. Each exits with its container's code."""
    preflight_cmd, train_cmd = readme_people_commands()
    assert preflight_cmd.endswith("run --rm preflight"), preflight_cmd
    assert train_cmd.endswith("run --rm --no-deps train-ddp"), train_cmd
    state = tmp_path / "state"
    state.mkdir()
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    cfg["training"].update(max_steps=6, log_every=2)  # a progress line, then the tables
    cfg["distributed"]["master_port"] = free_port()
    (state / "short.yaml").write_text(yaml.safe_dump(cfg))
    cfg["training"]["max_steps"] = 2  # piped: only the JSON lines are looked at
    (state / "piped.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "runs").mkdir()
    project = f"newcomer-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": project,
        "UPS_IMAGE_CPU": ups_image,
        "UPS_CONFIG": ".ups/short.yaml",
        "UPS_STATE_DIR": str(state),
        "UPS_DATA_DIR": str(demo_data.parent),
        "UPS_RUNS_DIR": str(tmp_path / "runs"),
        "UPS_CACHE_DIR": str(tmp_path / "cache"),
    }
    try:
        code, screen = _on_a_terminal(preflight_cmd.split(), env, timeout=300)
        assert code == 0, screen[-3000:]
        assert re.search(r"CHECK\s+STATUS\s+VALUE\s+MESSAGE", screen), screen[-3000:]
        assert '{"' not in screen, screen[-3000:]
        code, screen = _on_a_terminal(train_cmd.split(), env, timeout=400)
        assert code == 0, screen[-3000:]
        for shown in ("launch plan", "train ", "held-out evaluation", "finished (exit 0)"):
            assert shown in screen, f"{shown!r} not on the terminal:\n{screen[-3000:]}"
        assert '{"' not in screen, screen[-3000:]

        piped = subprocess.run(
            train_cmd.split(), cwd=REPO, env={**env, "UPS_CONFIG": ".ups/piped.yaml"},
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert piped.returncode == 0, piped.stderr[-2000:]
        assert any(line.startswith("{") for line in piped.stdout.splitlines()), piped.stdout
    finally:
        subprocess.run(
            [*COMPOSE, "-p", project, "down", "--remove-orphans"],
            cwd=REPO, env=env, capture_output=True, timeout=120,
        )  # fmt: skip
