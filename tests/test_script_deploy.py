"""`fab deploy` of your own script on a real sshd (the `container` host kind), from the
script's own folder outside the checkout, made a project by `ups init` (its fabfile.py).

One test in phases, each a real deploy of examples/ddp/train.py (plain DDP, gloo, two
ranks, a few seconds): `--run-file` with the script's arguments after `--` (replacing the
run file's own), held mid-run, stopped by `fab stop` and deployed again after its
checkpoints on the host were lost, resuming from the checkpoint ups had uploaded to the
run file's bucket (a real S3 gateway) to the end, with final weights equal to the
uninterrupted run's (``tests.launch_helpers.ddp_script_reference``, trained once per test
run and shared with tests/test_script_recipes.py and tests/test_checkpoint_sync.py); then
`--script train.py -- ARGS` with a rank raising.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.deploy_fixtures import REPO, VENV_BIN, SshServer, fab, sshd
from tests.launch_helpers import ddp_script_reference
from tests.s3_server import S3Server, s3_server

__all__ = ["s3_server", "sshd"]  # fixtures used by name below

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

STEPS = 10
"""The deployed runs train this many steps: the shared reference's (test_script_recipes')."""
SECRET = "script-secret-0123456789abcdef"
RUN_FILE = """\
script: train.py
args: [--steps, "14", --save-every, "4", --out, final.pt]
setup: ["python -c 'import sys; print(sys.version)' > setup-ran.txt # requirements.txt"]
env: [SCRIPT_TOKEN]
env_file: secrets.env
exclude: ["*.pt", checkpoints]
stop_grace_s: 30
"""


def _project(tmp_path: Path, s3: S3Server) -> Path:
    """The script's folder, made a project as a user would: `ups init` (fabfile.py and a
    starter ups-run.yaml, which the test's own run file then replaces)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "examples" / "ddp" / "train.py", proj / "train.py")
    subprocess.run([str(VENV_BIN / "ups"), "init"], cwd=proj, check=True, capture_output=True)
    assert (proj / "fabfile.py").is_file()
    sync = f"checkpoint_sync: {{url: {s3.url()}, endpoint_url: {s3.endpoint_url}}}\n"
    (proj / "ups-run.yaml").write_text(RUN_FILE + sync)
    (proj / "requirements.txt").write_text("# nothing to install\n")
    (proj / "secrets.env").write_text(f"SCRIPT_TOKEN={SECRET}\n")
    (proj / ".gitignore").write_text("secrets.env\n*.log\n")
    (proj / "notes.log").write_text("never sent\n")
    return proj


def _wait_for(path: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.3)  # waiting for the detached run to get there, bounded
    raise AssertionError(f"{text!r} not in {path} within {timeout} s")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def test_script_deploy_ends_truthfully_and_resumes_from_its_checkpoint(
    sshd: SshServer, s3_server: S3Server, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The script's arguments after `--` replace the run file's (.gitignore'd files, the
    secret and the S3 keys stay home; setup ran); `fab stop` preempts it (75) after it
    commits a checkpoint, which ups uploads to the bucket; with the host's checkpoints gone
    (a new disk) the same deploy again restores it from the bucket (UPS_RESUME) and ends
    truthfully (exit 0, finished) with weights `torch.equal` to the uninterrupted run's; a
    raising rank is named with its exception and exit code."""
    whole = ddp_script_reference(tmp_path_factory, STEPS)
    # The host runs this checkout's ups (the sshd session does not inherit PYTHONPATH).
    entry = sshd.host_entry(remote_env=f"export PYTHONPATH={REPO}")
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"test": entry})
    workdir = sshd.root / "remote"
    proj = _project(tmp_path, s3_server)
    to_host = ["deploy", "--host", "test", "--hosts-file", str(hosts), "--skip-preflight"]
    # `fab` in the project's folder; the arguments after `--` replace the run file's own
    # (its 14 steps: "training steps 6..10" below shows which were used). Held at step 6.
    deploy = [*to_host, "--run-file", "ups-run.yaml"]
    held = ["--", "--steps", str(STEPS), "--save-every", "4", "--out", "final.pt",
            "--pause-at", "6"]  # fmt: skip

    started = fab(*deploy, "--detach", *held, cwd=proj)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-2000:]
    # train.py, ups-run.yaml, requirements.txt, .gitignore, fabfile.py
    assert "5 file(s) sent" in started.stdout, started.stdout[-3000:]
    (code,) = (workdir / "code").glob("train-*")
    assert not (code / "notes.log").exists() and not (code / "secrets.env").exists()
    assert (code / "setup-ran.txt").is_file()
    run_id = started.stdout.split("started run ", 1)[1].split()[0]
    run_dir = workdir / "runs" / run_id
    _wait_for(run_dir / "logs" / "launch.log", "step 5 loss")  # then held at 6
    stopped = fab(
        "stop", "--host", "test", "--hosts-file", str(hosts), "--timeout", "120", cwd=proj
    )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "preempted (exit 75)" in stopped.stdout
    preempted = json.loads((run_dir / "outcome.json").read_text())
    assert preempted["checkpoint"].endswith("checkpoints/step_000006.pt")
    latest = s3_server.data / s3_server.bucket / "runs" / run_id / "script-latest.json"
    assert json.loads(latest.read_text())["name"] == "step_000006.pt"
    shutil.rmtree(run_dir / "checkpoints")  # the host's disk lost them; the bucket has them

    again = fab(*deploy, *held, cwd=proj)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"continuing run {run_id}" in again.stdout
    assert f"training steps 6..{STEPS}" in again.stdout
    assert "finished (exit 0)" in again.stdout and "finished: weights in final.pt" in again.stdout
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "finished"
    assert outcome["resumed_from"]["checkpoint"] == preempted["checkpoint"]
    assert outcome["resumed_from"]["why"].endswith(
        f"restored from {s3_server.url()}/{run_id}/checkpoints/step_000006.pt"
    )
    said = started.stdout + started.stderr + again.stdout + again.stderr
    assert SECRET not in said
    assert s3_server.secret_key not in said
    launch_log = (run_dir / "logs" / "launch.log").read_text()
    assert SECRET not in launch_log
    assert s3_server.secret_key not in launch_log
    resumed = _weights(code / "final.pt")
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)

    # The script alone (no run file: no setup, no secrets), its arguments after `--`.
    failed = fab(*to_host, "--script", "train.py", "--fresh", "--",
                 "--steps", str(STEPS), "--fail-rank", "1", "--fail-at", "3", cwd=proj)  # fmt: skip
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "0 file(s) sent" in failed.stdout  # the same folder, already on the host
    assert "rank 1 exited with code 1: RuntimeError: boom on rank 1 at step 3" in failed.stdout
