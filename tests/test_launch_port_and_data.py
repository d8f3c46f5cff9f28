"""Two ways a launch used to die late: a bad data path and a master port taken by a stranger.

A data file the config check can see is missing: exit 2 with one paragraph, before any
run directory exists and without touching ``latest``. A process that is not ``ups launch``
binds the planned master port after preflight checked it: torchrun's store cannot bind
it, no worker has started, and launch runs torchrun again on a fresh port.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, parse_events, worker_env
from tests.launch_helpers import ALLREDUCE, launch_cmd, run_launch, write_script


@pytest.mark.slow
def test_missing_data_file_is_a_config_error_before_anything_starts(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """`--set tasks.0.path=<missing>`: exit 2, the key and the fix named once on stderr, no
    traceback, no new run directory, `latest` still points where it did."""
    config = make_config()
    runs = tmp_path / "runs"
    earlier = runs / "t-earlier"
    earlier.mkdir(parents=True)
    (runs / "latest").symlink_to("t-earlier")
    missing = tmp_path / "data" / "advection.h5"
    result = run_launch(str(config), "--set", f"tasks.0.path={missing}", timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("tasks.0.path") == 1, result.stderr
    assert result.stderr.count("does not exist") == 1
    assert "ups data synth" in result.stderr  # the fix
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""  # nothing started: no plan, no preflight table
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "t-earlier"]
    assert os.readlink(runs / "latest") == "t-earlier"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_port_taken_after_preflight_moves_to_a_fresh_port(tmp_path: Path) -> None:
    """A foreign process binds the planned master port between preflight and torchrun
    (when launch says it is starting torchrun): the launch still finishes, on another
    port, with one info event naming both ports and no warning or traceback."""
    port = _free_port()
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE)
    cmd = launch_cmd(
        "--script", str(script), "--output-dir", str(tmp_path / "runs"),
        "--master-port", str(port), "--nproc-per-node", "2",
        "--preflight-skip", "allreduce", "--log-format", "json",
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=worker_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    bound = False
    foreign = socket.socket()  # this test process is the stranger: no ups lock, a listener
    try:
        for line in proc.stdout:
            lines.append(line)
            if '"torchrun_starting"' in line and not bound:
                # The preflight report is out and its ports check passed; torchrun's child
                # still has to import torch before its agent binds the store.
                foreign.bind(("0.0.0.0", port))
                foreign.listen()
                bound = True
        rc = proc.wait(timeout=240)
    finally:
        foreign.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    assert bound, out  # the stranger really took the port in between
    assert rc == 0, out
    events = parse_events(out)
    assert any(line.startswith("ports") and "PASS" in line for line in lines), out
    switched = [e for e in events if e["event"] == "master_port_switched"]
    assert len(switched) == 1, out
    assert switched[0]["level"] == "info"
    assert switched[0]["previous_port"] == port and switched[0]["port"] != port
    done = [e for e in events if e["event"] == "allreduced"]
    assert {e["master_port"] for e in done} == {str(switched[0]["port"])}
    assert sorted(e["sum"] for e in done) == [3.0, 3.0]
    assert "Traceback" not in out and "EADDRINUSE" not in out
    # No warning from the switch; preflight's own rows are this host's (CI's machine once
    # had under 10 GiB free, and the disk row warned).
    noise = [e for e in events if e["event"] != "preflight_check"]
    assert not [e for e in noise if e.get("level") in ("warning", "error")], out
