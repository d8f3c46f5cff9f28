"""Helpers for the lifecycle tests: `ups launch` with a marker in its environment, so
every process it started can be found afterwards, wherever it was re-parented."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import torch

from tests.conftest import REPO, parse_events, worker_env
from tests.launch_helpers import launch_cmd
from ups.train.checkpoint import list_checkpoints, load_checkpoint

MARKER = "UPS_TEST_MARKER"


def launch_env(marker: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return worker_env({MARKER: marker, **(extra or {})})


def start(marker: str, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        launch_cmd(*args),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=launch_env(marker, env), cwd=REPO,
    )  # fmt: skip


def run(
    marker: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        launch_cmd(*args), capture_output=True, text=True, timeout=timeout,
        env=launch_env(marker, env), cwd=REPO,
    )  # fmt: skip
    assert_no_survivors(marker)
    return proc


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def survivors(marker: str) -> list[str]:
    """Live processes (not zombies) whose environment carries this test's marker."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARKER) == marker:
                found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}")
        except psutil.Error:
            continue
    return found


def assert_no_survivors(marker: str, wait_s: float = 10.0) -> None:
    """Nothing the launch started is alive (a short wait for exits already under way)."""
    deadline = time.monotonic() + wait_s
    while (left := survivors(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)  # processes exiting after SIGKILL: nothing to wait on jointly
    assert not left, f"processes outlived ups launch: {left}"


def last_event(output: str) -> dict[str, Any]:
    events = parse_events(output)
    assert events, output[-2000:]
    return events[-1]


def outcome(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "outcome.json").read_text())
    return data


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _, path = list_checkpoints(run_dir / "checkpoints")[-1]
    model: dict[str, torch.Tensor] = load_checkpoint(path)["model"]
    return model


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float, **match: Any) -> None:
    """Poll launch.log until an event with these fields appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for e in parse_events(path.read_text()):
                if all(e.get(k) == v for k, v in match.items()):
                    return
        assert proc.poll() is None, "launch ended before the event appeared"
        time.sleep(0.2)  # polling a file another process writes
    raise AssertionError(f"no event {match} in {path} within {timeout} s")
