"""Helpers for the lifecycle tests: `ups launch` with a marker in its environment, so
every process it started can be found afterwards, wherever it was re-parented; and the
launches that several tests read, each made once per test run (:func:`shared_launch`: a
plain finishing run, a crashed one, a segfaulted one, a diverged one)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import yaml

from tests.conftest import REPO, made_once_per_run, parse_events, tiny_config, worker_env
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


def survivors_after(marker: str, wait_s: float = 10.0) -> list[str]:
    """:func:`survivors`, after a short wait for exits already under way."""
    deadline = time.monotonic() + wait_s
    while (left := survivors(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)  # processes exiting after SIGKILL: nothing to wait on jointly
    return left


def assert_no_survivors(marker: str, wait_s: float = 10.0) -> None:
    """Nothing the launch started is alive (a short wait for exits already under way)."""
    left = survivors_after(marker, wait_s)
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


@dataclass
class Launched:
    """What one `ups launch` printed and left: its exit code, stdout and stderr (pipes, so
    JSON lines), the processes that outlived it, its output directory; the config it ran
    and how long it took (wall seconds), for the launches :func:`shared_launch` makes."""

    output_dir: Path
    returncode: int
    stdout: str
    stderr: str
    survivors: list[str]
    config: Path
    seconds: float


def shared_launch(
    factory: pytest.TempPathFactory,
    name: str,
    config: dict[str, Any],
    *args: str,
    env: Mapping[str, str] | None = None,
) -> Launched:
    """`ups launch CONFIG ARGS` of ``config`` (its ``run.output_dir`` is replaced by the
    shared directory's ``runs``), stdout and stderr pipes, ``env`` added: made once per
    test run under ``name`` and read by every test that checks that run (tests in several
    modules may check different things about one launch). Read-only: a test that continues
    the run works on a copy of its output directory."""

    def launch(root: Path) -> None:
        path = root / "config.yaml"
        run_section = {**config["run"], "output_dir": str(root / "runs")}
        path.write_text(yaml.safe_dump({**config, "run": run_section}))
        marker = str(root)
        started = time.monotonic()
        done = subprocess.run(
            launch_cmd(str(path), *args),
            capture_output=True, text=True, timeout=400, env=launch_env(marker, env), cwd=REPO,
        )  # fmt: skip
        seconds = time.monotonic() - started
        (root / "launched.json").write_text(json.dumps({
            "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "survivors": survivors_after(marker), "seconds": seconds,
        }))  # fmt: skip

    root = made_once_per_run(factory, name, launch)
    got = json.loads((root / "launched.json").read_text())
    return Launched(root / "runs", got["returncode"], got["stdout"], got["stderr"],
                    got["survivors"], root / "config.yaml", got["seconds"])  # fmt: skip


FINISHED_RUN_ID = "ws"


def finished_config(output_dir: Path, tiny_data: dict[str, Path]) -> dict[str, Any]:
    """:func:`finished_launch`'s config, writing to ``output_dir``."""
    return tiny_config(output_dir, tiny_data, training={"max_steps": 4},
                       checkpoint={"every_steps": 2})  # fmt: skip


def finished_launch(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Launched:
    """`ups launch CONFIG --run-id ws --skip-preflight` of the tiny config, 4 steps on 2
    ranks with a checkpoint every 2, stdout and stderr pipes: the plain run that finishes
    (preflight before the trainer: tests/test_launch_ports.py). Made once per test run and
    read by every test that checks such a run; a test that continues it works on a copy of
    its output directory."""
    config = finished_config(Path("runs"), tiny_data)
    return shared_launch(factory, "finished-launch", config,
                         "--run-id", FINISHED_RUN_ID, "--skip-preflight")  # fmt: skip


CRASH_STEP = 5
"""The step at which :func:`crashed_launch`'s rank 1 raises."""


def crashed_launch(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Launched:
    """`ups launch CONFIG --skip-preflight --max-restarts 2` of 10 steps with a checkpoint
    every 2, where rank 1 raises a Python exception at step :data:`CRASH_STEP`
    (``exception@1:5``): the deterministic crash of one rank (tests/test_faults.py reads
    what the trainer says about it, tests/test_lifecycle_restart.py what launch does after
    it). Made once per test run; read-only."""
    config = tiny_config(Path("runs"), tiny_data, training={"max_steps": 10},
                         checkpoint={"every_steps": 2})  # fmt: skip
    return shared_launch(factory, "crashed-launch", config, "--skip-preflight",
                         "--max-restarts", "2",
                         env={"UPS_FAULTS": f"exception@1:{CRASH_STEP}"})  # fmt: skip


SEGFAULT_RUN_ID = "sf"


def segfaulted_launch(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Launched:
    """`ups launch CONFIG --run-id sf --skip-preflight` of 20 steps where rank 1 dies of a
    real SIGSEGV at step 2 (the config's ``faults:``): the crash in native code of one rank
    (tests/test_launch_trainer.py reads what launch's outcome names, tests/test_faults.py
    what the trainer and W&B left). Made once per test run; read-only."""
    config = tiny_config(Path("runs"), tiny_data, training={"max_steps": 20},
                         faults=[{"kind": "segfault", "rank": 1, "step": 2}])  # fmt: skip
    return shared_launch(factory, "segfaulted-launch", config,
                         "--run-id", SEGFAULT_RUN_ID, "--skip-preflight")  # fmt: skip


def diverged_launch(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Launched:
    """`ups launch CONFIG --skip-preflight --max-restarts 2 --set training.lr=1e6` of 20
    steps with a checkpoint every 2: the run whose loss diverges (tests/test_faults_agreement.py
    reads how every rank stops at one step, tests/test_lifecycle_restart.py what launch
    does after it). Made once per test run; read-only."""
    config = tiny_config(Path("runs"), tiny_data, training={"max_steps": 20},
                         checkpoint={"every_steps": 2})  # fmt: skip
    return shared_launch(factory, "diverged-launch", config, "--skip-preflight",
                         "--max-restarts", "2", "--set", "training.lr=1e6")  # fmt: skip
