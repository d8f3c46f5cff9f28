"""Supervision survives its own process: a detached deploy leaves a background supervisor;
a second one refuses (the lease); a supervisor killed with SIGKILL is replaced by running
the same deploy again, which follows the instance still running (no second one) or, when
the instance was outbid while nothing supervised it, recovers the run on a new instance
from the run's bucket on another machine that kept nothing of it (that deploy killed in
turn right after renting, the next one sets the rented instance up), finishing
bit-for-bit. FAKE Vast API, real instances, a real S3 gateway on loopback.

Each test prints what it measured (seconds from the new supervisor's start to following
or recovered, steps lost): ``pytest -s`` shows them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data, demo_reference
from tests.fake_vast import FakeVast, fab_env, fake_vast
from tests.s3_server import S3Server, s3_server
from tests.test_vast_recovery import _events, _final_model, _hosts
from ups.bucket import Bucket, committed_checkpoints
from ups.deploy.managed import lease
from ups.deploy.managed.lease import EXIT_SUPERVISED
from ups.deploy.managed.watch import RECOVERY_EVENT

__all__ = ["demo_data", "fake_vast", "s3_server"]  # fixtures used by name below

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _fab(
    cwd: Path, fake: FakeVast, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FAB), "-r", str(REPO), *args], cwd=cwd, text=True,
        env=fab_env(fake, cwd, **(env or {})),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _deploy_args(hosts: Path, config: Path, run: str, *extra: str) -> list[str]:
    return ["deploy", "--host", "vast", "--hosts-file", str(hosts), "--config", str(config),
            "--run", run, *extra]  # fmt: skip


def _done(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def _detached_supervisor(run_dir: Path, timeout: float = 120) -> lease.Holder:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = lease.holder(run_dir)
        if held is not None and held.mode == "detached":
            return held
        time.sleep(0.2)  # the background supervisor taking its lease
    log = run_dir / "supervisor.log"
    raise AssertionError(
        f"no detached supervisor: {log.read_text()[-3000:] if log.exists() else ''}"
    )


def _synced(run_dir: Path, held: lease.Holder, step: int, timeout: float = 300) -> None:
    """Wait until the background supervisor has copied checkpoint ``step`` home."""
    path = run_dir / "checkpoints" / f"step_{step:06d}.pt"
    deadline = time.monotonic() + timeout
    while not path.exists():
        log = run_dir / "supervisor.log"
        alive = held.alive()
        assert alive and time.monotonic() < deadline, (
            f"{path} never synced (supervisor alive: {alive}):\n"
            + (log.read_text()[-3000:] if log.exists() else "")
        )
        time.sleep(0.2)  # the supervisor's sync thread writing it


def _sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"supervisor {pid} survived SIGKILL"
        time.sleep(0.1)  # the kernel reaping it


def _wait_line(proc: subprocess.Popen[str], text: str, timeout: float) -> list[str]:
    """Read ``proc``'s stdout until a line holds ``text``; the lines read so far."""
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    seen.wait(timeout)
    assert seen.is_set(), "".join(lines)[-4000:]
    return lines


def _seconds(line: str) -> float:
    return float(line.split(" s after this supervisor started")[0].rsplit(" ", 1)[1])


def test_killed_supervisor_is_replaced_and_follows_the_same_instance(
    fake_vast: FakeVast, demo_data: Path, tmp_path: Path
) -> None:
    """--detach leaves a supervisor that syncs checkpoints; a second deploy of the run exits
    20 naming it; `fab instances` shows it; SIGKILLed, the same deploy run again follows
    the instance still running from where the local log stopped: no second instance, no
    recovery, the steps go on, Ctrl-C then ends the one instance."""
    hosts = _hosts(fake_vast, tmp_path, demo_data)
    config = demo_config(tmp_path / "demo.yaml", max_steps=100_000, nproc=1)
    run_dir = tmp_path / "runs" / "again"
    # No preflight (test_vast_lifecycle's happy path covers it; the bucket test below runs
    # it on a fresh and on an adopted instance): every deploy here names the same run.
    deploy = _deploy_args(hosts, config, "again", "--skip-preflight")
    code, out, err = _done(_fab(tmp_path, fake_vast, *deploy, "--detach"), 300)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "follows run again in the background" in out
    held = _detached_supervisor(run_dir)
    (inst,) = fake_vast.live()

    code, out, err = _done(_fab(tmp_path, fake_vast, *deploy), 120)
    assert code == EXIT_SUPERVISED, out[-2000:] + err[-2000:]
    assert f"already supervised by the detached supervisor pid {held.pid}" in err
    assert "Traceback" not in err
    code, out, err = _done(_fab(tmp_path, fake_vast, "instances", "--hosts-file", str(hosts)), 60)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("again "))
    assert f"detached (pid {held.pid})" in row

    _synced(run_dir, held, step=10)
    _sigkill(held.pid)
    seen = max(e["step"] for e in _events(run_dir / "logs" / "launch.log", "train_step"))
    assert lease.holder(run_dir) is None  # a killed supervisor holds nothing
    proc = _fab(tmp_path, fake_vast, *deploy)
    lines = _wait_line(proc, "following run again on instance", timeout=240)
    following = _seconds(lines[-1])
    assert f"instance {inst.id} (alive)" in lines[-1]
    log = run_dir / "logs" / "launch.log"
    deadline = time.monotonic() + 240
    while max(e["step"] for e in _events(log, "train_step")) < seen + 10:
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not go on"
        time.sleep(0.5)  # the followed run logging new steps
    proc.send_signal(signal.SIGINT)
    code, out, err = _done(proc, 120)
    assert code == 130, out[-2000:] + err[-2000:]
    # The plan said what happened: the run's instance picked up, no new rental.
    assert f"rental plan: run again picks up its instance {inst.id} if it still runs" in (
        "".join(lines) + out
    )
    assert "interrupted (Ctrl-C)" in err, err[-2000:]
    assert fake_vast.live() == [] and list(fake_vast.destroyed) == [inst.id]
    steps = [e["step"] for e in _events(log, "train_step")]
    assert steps == sorted(set(steps)), "a step logged twice or out of order"
    state = json.loads((run_dir / "run.json").read_text())
    assert state["recoveries"] == 0 and [i["instance_id"] for i in state["instances"]] == [
        str(inst.id)
    ]
    print(f"\nMEASURE supervisor restart -> following: {following:.1f} s")


def test_outbid_while_unsupervised_recovers_from_the_bucket_on_the_next_deploy_bit_for_bit(
    fake_vast: FakeVast,
    demo_data: Path,
    s3_server: S3Server,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The run names a bucket. Detached; its supervisor SIGKILLed once the instance has
    committed checkpoint 10 in the bucket; the instance is outbid while nothing supervises.
    The config says `credentials: account` (rclone has no STS): the account keys go to the
    host, with one warning saying what that exposes. The same deploy run again on another
    machine (its own HOME, state dir and runs/: no checkpoint, no supervision state of this
    run) takes the run's state from the bucket, fetches step 10 from it, ends the outbid
    instance and rents another, and is itself SIGKILLed right after that create; run once
    more there, it adopts the new instance, sets it up, resumes from step 10 and finishes:
    one recovery, two instances, both destroyed, weights equal to an uninterrupted run's.
    A third machine with only the bucket reads the run's whole log."""
    fake_vast.disk_seeds = [{".faults": "hang@0:15"}]  # the first instance never passes 15
    hosts = _hosts(fake_vast, tmp_path, demo_data, checkpoint_sync=s3_server.url())
    # rclone mints no scoped credentials (no STS): the account's keys, said once. The
    # config is test_failover's (30 steps, this checkpoint_sync): one reference for both.
    account = {"credentials": "account"}
    config = demo_config(
        tmp_path / "demo.yaml", max_steps=30, nproc=1, extra={"checkpoint_sync": account}
    )
    s3_env = {**s3_server.client_env(), "AWS_ENDPOINT_URL": s3_server.endpoint_url}
    run_dir = tmp_path / "runs" / "unsup-s3"
    deploy = _deploy_args(hosts, config, "unsup-s3")
    code, out, err = _done(_fab(tmp_path, fake_vast, *deploy, "--detach", env=s3_env), 300)
    assert code == 0, out[-3000:] + err[-3000:]
    warning = "warning: checkpoint_sync.credentials: account sends this machine's own S3 keys"
    assert out.count(warning) == 1, out[-3000:]
    held = _detached_supervisor(run_dir)
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    deadline = time.monotonic() + 300
    while 10 not in [r.step for r in committed_checkpoints(bucket, "unsup-s3")]:
        assert time.monotonic() < deadline, "checkpoint 10 never reached the bucket"
        time.sleep(0.5)  # the instance's uploader committing it
    _sigkill(held.pid)
    (first,) = fake_vast.live()
    first_log = first.root / "disk" / "workspace" / "runs" / "unsup-s3" / "logs" / "launch.log"
    fake_vast.outbid(first.id)
    reached = max(e["step"] for e in _events(first_log, "train_step"))

    # Another machine recovers the run from the bucket; its supervisor is itself killed
    # right after it created the replacement (still loading, nothing set up on it): the
    # next deploy there adopts that healthy instance, sets it up (checkpoint and log
    # uploaded, then preflight) instead of destroying it, and counts no second recovery
    # for the one outbid.
    other = tmp_path / "always-on-host"  # HOME, state dir and runs/ of another machine
    other.mkdir()
    run_dir = other / "runs" / "unsup-s3"
    recovering = _fab(other, fake_vast, *deploy, env=s3_env)
    lines = _wait_line(recovering, "created instance", timeout=240)
    _sigkill(recovering.pid)
    _done(recovering, 30)
    (second,) = fake_vast.live()
    assert f"created instance {second.id}" in lines[-1], lines[-1]
    said = "".join(lines)
    where = "s3://ups-test/runs/unsup-s3/"
    assert f"supervised elsewhere: its state is taken from {where}" in said, said[-4000:]
    assert f"fetched checkpoint step 10 from {where}" in said, said[-4000:]
    picking = next(line for line in lines if "recovery 1/3: picking up run unsup-s3" in line)
    assert "from step 10" in picking, picking

    code, out, err = _done(_fab(other, fake_vast, *deploy, env=s3_env), 400)
    assert code == 0, out[-4000:] + err[-3000:]
    assert f"picking up run unsup-s3: instance {second.id} is" in out, out[-4000:]
    assert f"instance {second.id} was rented for run unsup-s3 but not set up" in out
    assert "uploaded checkpoint step 10" in out, out[-4000:]
    assert "recovery 2" not in out, out[-4000:]
    assert fake_vast.live() == [] and len(fake_vast.destroyed) == 2
    for inst in fake_vast.destroyed.values():  # what `credentials: account` sends
        creds = (
            inst.root / "disk" / "workspace" / ".ups" / "deploy" / "unsup-s3" / "aws_credentials"
        )
        assert s3_server.secret_key in creds.read_text(), f"no account keys on {inst.id}"
    (marked,) = _events(run_dir / "logs" / "launch.log", RECOVERY_EVENT)
    assert marked["resume_step"] == 10 and marked["lost_instance"] == str(first.id), marked
    _same_weights_as_uninterrupted(run_dir, tmp_path_factory, config, demo_data)
    resumed = next(line for line in out.splitlines() if "resumed; since detection" in line)
    # The account covers both instances, the one lost while nobody supervised included:
    # one cost each, and the total is their sum.
    summary = next(line for line in out.splitlines() if "run summary: run unsup-s3" in line)
    costs = [float(c) for c in re.findall(r"\d+ \$([0-9.]+)", summary.split("used (")[1])]
    total = float(summary.split("about $")[1].split(" ")[0])
    assert len(costs) == 2 and total == pytest.approx(sum(costs), abs=2e-4), summary
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["ended"] == "exit 0", record["status"]
    assert record["recoveries"] == 1, record["history"]
    assert [i["instance_id"] for i in record["instances"]] == [str(first.id), str(second.id)]
    assert [i["end_reason"] != "" for i in record["instances"]] == [True, True]
    assert record["bucket_checkpoint"] == 30  # the bucket's newest committed checkpoint
    (recovery,) = record["history"]
    assert "outbid" in recovery["reason"], recovery
    assert recovery["lost_instance"] == str(first.id) and recovery["resume_step"] == 10
    assert recovery["downtime_s"] is not None

    # From a third machine with only the bucket: every step once, the recovery mark (naming
    # the lost instance) between the two instances' steps.
    third = tmp_path / "third-machine"
    third.mkdir()
    code, out, err = _done(
        _fab(third, fake_vast, "logs", "--host", "vast", "--hosts-file", str(hosts), "--run",
             "unsup-s3", env=s3_env), 120,
    )  # fmt: skip
    assert code == 0, out[-3000:] + err[-3000:]
    assert "its log as saved in s3://ups-test/runs/unsup-s3/logs/launch.log" in out
    replay = third / "replayed.log"
    bucket_log = bucket.get_bytes("unsup-s3/logs/launch.log")
    assert bucket_log is not None
    replay.write_bytes(bucket_log)
    steps = [e["step"] for e in _events(replay, "train_step")]
    assert steps == sorted(set(steps)) and steps[-1] == 29, steps  # 0-based, every 5th
    log_lines = replay.read_text().splitlines()
    mark = next(i for i, line in enumerate(log_lines) if RECOVERY_EVENT in line)
    assert json.loads(log_lines[mark])["lost_instance"] == str(first.id)
    before = [e["step"] for e in _events(log_lines[:mark], "train_step")]
    after = [e["step"] for e in _events(log_lines[mark:], "train_step")]
    assert max(before) < 10 <= min(after)  # checkpoint 10: steps 0-9 done before it
    print(
        f"\nMEASURE supervisor restart -> recovered from the bucket (first step on the new "
        f"instance): {_seconds(resumed):.1f} s; the outbid instance had logged step {reached} "
        "(every 5th is logged), the run resumed from 10"
    )


def _same_weights_as_uninterrupted(
    run_dir: Path, factory: pytest.TempPathFactory, config: Path, demo_data: Path
) -> None:
    mine = _final_model(run_dir)
    theirs = _final_model(demo_reference(factory, config, demo_data))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
