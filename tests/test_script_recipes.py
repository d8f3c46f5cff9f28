"""The Lightning and Accelerate recipes (examples/lightning, examples/accelerate), 2 gloo
ranks: stopped by SIGTERM mid-run, the same command resumes from the checkpoint the script
committed, to final weights equal to an uninterrupted run's. Accelerate under ``ups launch
--run-file``; Lightning the way a user ships it, through ``fab deploy`` to a real sshd, with
``fab stop`` and a ``fab fetch`` that brings its checkpoint and ``lightning_logs/`` home
between the two deploys. The three recipes train the same model on the same data with the
same optimizer and end bit-identical, so the uninterrupted run is the plain-DDP one
(examples/ddp, which imports neither library: the cheapest), trained once per test run
for both tests and tests/test_checkpoint_sync.py's script test
(``tests.launch_helpers.ddp_script_reference``); the plain-DDP recipe's own
stop-and-resume proof is tests/test_script_deploy.py's.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, worker_env
from tests.deploy_fixtures import SshServer, fab, sshd
from tests.launch_helpers import ddp_script_reference, launch_cmd, outcome_of

__all__ = ["sshd"]  # a fixture used by name below

pytestmark = pytest.mark.slow

STEPS = 10
"""Every run here trains this many steps (the shared reference's too)."""


def _launch(recipe: str, runs: Path, run_id: str, *script_args: str) -> subprocess.Popen[str]:
    run_file = REPO / "examples" / recipe / "ups-run.yaml"
    argv = launch_cmd(
        "--run-file", str(run_file), "--skip-preflight", "--output-dir", str(runs),
        "--run-id", run_id, "--", "--steps", str(STEPS), "--save-every", "4", *script_args,
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


def _wait_for(path: Path, text: str, alive: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert alive() and time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.2)  # polling a log another process writes, bounded


@pytest.mark.parametrize("recipe", ["accelerate"])
def test_recipe_stopped_by_sigterm_resumes_to_the_uninterrupted_weights(
    recipe: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    runs = tmp_path / "runs"
    whole = ddp_script_reference(tmp_path_factory, STEPS)

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
    cut = torch.load(tmp_path / "cut.pt")
    assert whole.keys() == cut.keys()
    assert all(torch.equal(whole[k], cut[k]) for k in whole)


LIGHTNING_RUN_FILE = f"""\
script: train.py
args: [--steps, "{STEPS}", --save-every, "4", --out, final.pt]
checkpoint_dir: ckpts
outputs: [lightning_logs]
exclude: [ckpts, lightning_logs, "*.pt"]
stop_grace_s: 30
"""


@pytest.mark.ssh
def test_lightning_stopped_mid_fit_through_fab_deploy_comes_home_and_resumes(
    sshd: SshServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`fab deploy` of the Lightning recipe, held at step 6: `fab stop` is preempted (75)
    naming the checkpoint it committed, after a stop announcement that promises the script
    only SIGTERM and its grace; `fab fetch` brings that checkpoint (its run file's
    checkpoint_dir) and Lightning's lightning_logs/ (its `outputs`) home, byte for byte;
    the same deploy again continues the run from it to weights `torch.equal` to an
    uninterrupted run's."""
    whole = ddp_script_reference(tmp_path_factory, STEPS)
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "examples" / "lightning" / "train.py", proj / "train.py")
    (proj / "ups-run.yaml").write_text(LIGHTNING_RUN_FILE)
    entry = sshd.host_entry(remote_env=f"export PYTHONPATH={REPO}")
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"test": entry})
    on = ["--host", "test", "--hosts-file", str(hosts)]
    deploy = ["deploy", *on, "--skip-preflight", "--run-file", str(proj / "ups-run.yaml")]
    held = f"--script-args=--steps {STEPS} --save-every 4 --out final.pt --pause-at 6"

    started = fab(*deploy, held, "--detach")
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-2000:]
    run_id = started.stdout.split("started run ", 1)[1].split()[0]
    run_dir = sshd.root / "remote" / "runs" / run_id
    _wait_for(run_dir / "logs" / "launch.log", "step 6 loss", lambda: True)
    stopped = fab("stop", *on, "--timeout", "150")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    (code_dir,) = (sshd.root / "remote" / "code").glob("train-*")
    saved = code_dir / "ckpts" / "step_000006.ckpt"
    assert f"preempted (exit 75); checkpoint {saved}" in stopped.stdout, stopped.stdout
    assert f"they committed checkpoint {saved}" in stopped.stdout
    log = (run_dir / "logs" / "launch.log").read_text()
    assert "SIGTERM sent to the script's ranks; they have 30 s (stop_grace_s)" in log

    home = tmp_path / "home"
    fetched = fab("fetch", *on, "--dest", str(home), timeout=120)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    outputs = home / run_id / "outputs"
    assert (outputs / "ckpts" / saved.name).read_bytes() == saved.read_bytes()
    assert list((outputs / "lightning_logs").glob("version_*/metrics.csv")), fetched.stdout

    again = fab(*deploy, held)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"continuing run {run_id}" in again.stdout
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "finished" and outcome["resumed_from"]["checkpoint"] == str(saved)
    cut = torch.load(code_dir / "final.pt")
    assert whole.keys() == cut.keys()
    assert all(torch.equal(whole[k], cut[k]) for k in whole)
