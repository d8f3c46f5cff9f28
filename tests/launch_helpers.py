"""Helpers for the `ups launch` tests: run the real CLI, tiny torchrun-compatible scripts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import PYTHON, REPO, made_once_per_run, parse_events, worker_env

if TYPE_CHECKING:
    import torch

ALLREDUCE = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# One write per line: print() writes the text and the newline separately, so two ranks
# sharing the pipe could interleave into one unparseable line.
sys.stdout.write(json.dumps({"event": "allreduced", "rank": dist.get_rank(), "sum": t.item(),
                  "world_size": dist.get_world_size(), "master_port": os.environ["MASTER_PORT"],
                  "run_id": os.environ["UPS_RUN_ID"]}) + "\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""

RAISE_ON_RANK1 = """
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise RuntimeError("boom on rank 1")
    dist.barrier()

main()
"""

SEGFAULT_ON_RANK1 = """
import os, signal
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGSEGV)
dist.barrier()
"""


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def launch_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "ups", "launch", *args]


def run_launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `ups launch ARGS` to completion (stdout is a pipe, so lines are raw JSON)."""
    return subprocess.run(
        launch_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=worker_env(),
        cwd=REPO,
    )


def outcome_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "outcome.json").read_text())
    return data


def events_named(text: str, name: str) -> list[dict[str, Any]]:
    return [e for e in parse_events(text) if e["event"] == name]


def wait_for_event(path: Path, name: str, proc: subprocess.Popen[str], timeout: float) -> None:
    """Poll launch.log (the file `fab logs` follows) until an event appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and any(e["event"] == name for e in parse_events(path.read_text())):
            return
        assert proc.poll() is None, "launch ended before the event appeared"
        time.sleep(0.2)  # polling a file another process writes; not synchronisation by sleep
    raise AssertionError(f"no {name!r} event in {path} within {timeout} s")


def ddp_script_reference(factory: pytest.TempPathFactory, steps: int) -> dict[str, torch.Tensor]:
    """The final weights of examples/ddp/train.py trained ``steps`` steps uninterrupted on 2
    ranks under `ups launch --run-file`: what a stopped and resumed run of that script (or of
    the Lightning and Accelerate recipes, which compute the same) must end equal to. Made
    once per test run for each ``steps`` and shared by every test that compares with it
    (where checkpoints are saved or uploaded changes nothing computed)."""

    def train(root: Path) -> None:
        done = run_launch(
            "--run-file", str(REPO / "examples" / "ddp" / "ups-run.yaml"), "--skip-preflight",
            "--output-dir", str(root / "runs"), "--run-id", "whole",
            "--", "--steps", str(steps), "--save-every", "4", "--out", str(root / "whole.pt"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

    import torch

    root = made_once_per_run(factory, f"ddp-script-reference-{steps}", train)
    weights: dict[str, torch.Tensor] = torch.load(root / "whole.pt", weights_only=True)
    return weights
