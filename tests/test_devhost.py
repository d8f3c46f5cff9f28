"""`ups dev-host up` gives a real loopback SSH host that the docs' deploy commands work on;
`ups dev-host down` leaves nothing behind (no sshd, no run, no directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.deploy_fixtures import demo_data, free_port
from tests.repo_scripts import captures

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

__all__ = ["demo_data"]  # fixture used by name below


def _run(*argv: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def _wait_for_step(log: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and any(
            json.loads(line).get("event") == "train_step" and json.loads(line)["step"] >= step
            for line in log.read_text().splitlines()
            if line.startswith("{")
        ):
            return
        time.sleep(0.5)  # polling the remote log file, bounded by the deadline
    raise AssertionError(f"no train_step {step} in {log} within {timeout} s")


def _alive_under(root: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter():
        try:
            if str(root) in " ".join(proc.cmdline()) or proc.cwd().startswith(str(root)):
                found.append(" ".join(proc.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
@pytest.mark.ssh
def test_dev_host_deploy_round_trip_then_down_leaves_nothing(
    demo_data: Path, tmp_path: Path
) -> None:
    """up prints the entry and the export line; deploy, status, stop (exit 75 at a checkpoint),
    the same deploy again (resumes to the end), logs, fetch; down refuses while a run there
    was not fetched (exit 3, naming it, nothing stopped); down --discard ends the sshd and
    the run still training there and removes the directory; a second down is exit 2."""
    if not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()):
        pytest.skip("sshd missing: run scripts/sshd-setup.sh")
    state = tmp_path / "state"
    env = {**os.environ}
    started = _run(
        str(BIN / "ups"), "dev-host", "up", "--state-dir", str(state), "--data", str(demo_data),
        env=env, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    hosts_file = state / "hosts.yaml"
    assert f"export UPS_HOSTS_FILE={hosts_file.resolve()}" in started.stdout
    entry = yaml.safe_load(hosts_file.read_text())["hosts"]["local"]
    assert entry["kind"] == "container" and entry["host"] == "127.0.0.1"
    assert f"port: {entry['port']}" in started.stdout  # the entry is printed, not only written
    record = json.loads((state / "state.json").read_text())
    root = Path(record["root"])
    fetched: Path | None = None
    try:
        env["UPS_HOSTS_FILE"] = str(hosts_file.resolve())
        sets = [
            # The demo config itself (292 steps), so its resumed end is the docs' numbers;
            # these keys change when things are logged and saved, not what is computed.
            "--set", "checkpoint.every_steps=10", "--set", "training.log_every=5",
            "--set", f"distributed.master_port={free_port()}",
        ]  # fmt: skip
        deploy = [str(BIN / "fab"), "deploy", "--host", "local", "--config", "configs/demo.yaml"]
        first = _run(*deploy, *sets, "--skip-preflight", "--detach", env=env)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
        run_id = first.stdout.split("started run ", 1)[1].split()[0]
        remote_run = root / "remote" / "runs" / run_id
        _wait_for_step(remote_run / "logs" / "launch.log", 5)
        status = _run(str(BIN / "fab"), "status", "--host", "local", env=env, timeout=60)
        assert status.returncode == 0 and f"run {run_id} on local" in status.stdout, status

        stopped = _run(str(BIN / "fab"), "stop", "--host", "local", env=env, timeout=200)
        assert "preempted (exit 75)" in stopped.stdout, stopped.stdout + stopped.stderr
        again = _run(*deploy, *sets, "--skip-preflight", env=env)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
        assert f"continuing run {run_id} on local" in again.stdout
        logs = _run(str(BIN / "fab"), "logs", "--host", "local", env=env, timeout=60)
        assert logs.returncode == 0 and "finished (exit 0)" in logs.stdout, logs

        fetch = _run(str(BIN / "fab"), "fetch", "--host", "local", env=env, timeout=120)
        assert fetch.returncode == 0, fetch.stderr
        fetched = REPO / "runs" / run_id
        outcome = json.loads((fetched / "outcome.json").read_text())
        assert outcome["outcome"] == "finished" and outcome["resumed_from"], outcome
        # The docs' demo capture and prose quote what the demo config gives here.
        differences = captures().check("demo", json.dumps(outcome["metrics"]))
        assert differences == [], f"{differences}: run `.venv/bin/python scripts/captures.py demo`"

        # A run still training when the host goes down is ended with it (held asleep at
        # step 6 until then by a pause fault, not training flat out on this machine).
        held = "faults=[{kind: pause, rank: 0, step: 6}, {kind: pause, rank: 1, step: 6}]"
        busy = _run(*deploy, *sets, "--set", "training.max_steps=100000", "--set", held,
                    "--fresh", "--skip-preflight", "--detach", env=env)  # fmt: skip
        assert busy.returncode == 0, busy.stderr
        busy_id = busy.stdout.split("started run ", 1)[1].split()[0]
        _wait_for_step(root / "remote" / "runs" / busy_id / "logs" / "launch.log", 1)
        # The held run was never fetched: down says so and stops nothing; the fetched,
        # finished run is not named.
        refused = _run(str(BIN / "ups"), "dev-host", "down", "--state-dir", str(state), env=env)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert f"{busy_id} (no outcome yet" in refused.stderr and run_id not in refused.stderr
        assert "`ups dev-host down --discard`" in refused.stderr and root.exists()
    finally:
        down = _run(str(BIN / "ups"), "dev-host", "down", "--discard", "--state-dir", str(state),
                    env=env)  # fmt: skip
        if fetched is not None:
            shutil.rmtree(fetched, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not psutil.pid_exists(record["pid"]) or (
        psutil.Process(record["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert _alive_under(root) == []
    assert not root.exists() and not hosts_file.exists()
    again_down = _run(str(BIN / "ups"), "dev-host", "down", "--state-dir", str(state), env=env)
    assert again_down.returncode == 2 and "no dev host recorded" in again_down.stderr
