"""The Lightning and Accelerate recipes (examples/lightning, examples/accelerate) under
``ups launch --run-file``, 2 gloo ranks: stopped by SIGTERM mid-run, the same command
resumes from the checkpoint the script committed, to final weights equal to an
uninterrupted run's. The three recipes train the same model on the same data with the same
optimizer and end bit-identical, so the uninterrupted run is the plain-DDP one
(examples/ddp, which imports neither library: the cheapest); the plain-DDP recipe's own
stop-and-resume proof is tests/test_script_deploy.py's.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, worker_env
from tests.launch_helpers import launch_cmd, outcome_of

pytestmark = pytest.mark.slow


def _launch(recipe: str, runs: Path, run_id: str, *script_args: str) -> subprocess.Popen[str]:
    run_file = REPO / "examples" / recipe / "ups-run.yaml"
    argv = launch_cmd(
        "--run-file", str(run_file), "--skip-preflight", "--output-dir", str(runs),
        "--run-id", run_id, "--", "--steps", "10", "--save-every", "4", *script_args,
    )  # fmt: skip
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.parametrize("recipe", ["lightning", "accelerate"])
def test_recipe_stopped_by_sigterm_resumes_to_the_uninterrupted_weights(
    recipe: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    code, out = _finish(_launch("ddp", runs, "whole", "--out", str(tmp_path / "whole.pt")))
    assert code == 0, out[-3000:]

    stopped = _launch(recipe, runs, "cut", "--pause-at", "6", "--out", str(tmp_path / "cut.pt"))
    log = runs / "cut" / "logs" / "launch.log"
    deadline = time.monotonic() + 180
    while not (log.exists() and "step 5 loss" in log.read_text(errors="replace")):
        assert stopped.poll() is None and time.monotonic() < deadline, "no step 5 in launch.log"
        time.sleep(0.2)
    stopped.send_signal(signal.SIGTERM)
    code, out = _finish(stopped)
    assert code == 75, out[-3000:]
    outcome = outcome_of(runs / "cut")
    assert outcome["outcome"] == "preempted", outcome
    saved = outcome["checkpoint"]  # the newest committed one, step 5 or 6
    assert Path(saved).parent == runs / "cut" / "checkpoints", outcome
    assert not (tmp_path / "cut.pt").exists()

    code, out = _finish(_launch(recipe, runs, "cut", "--out", str(tmp_path / "cut.pt")))
    assert code == 0, out[-3000:]
    outcome = outcome_of(runs / "cut")
    assert outcome["outcome"] == "finished" and outcome["resumed_from"]["checkpoint"] == saved
    whole, cut = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "cut.pt")
    assert whole.keys() == cut.keys()
    assert all(torch.equal(whole[k], cut[k]) for k in whole)
