"""`kind: slurm` against a real Slurm: two slurmd on loopback (tests/slurm_fixtures.py),
reached like a cluster's login node, over real SSH (sshd on this machine).

One job of the demo runs on two nodes x one rank through a requeue on the time-limit
warning, a `fab stop` and a second `fab deploy`, and ends with the same held-out numbers
and the same weights as the same config run uninterrupted by two ranks on one machine
(`ups launch`, deploy_fixtures.demo_reference). The other test
covers what never trains: a request the cluster cannot meet, and a node whose preflight
fails; then a script requeued by Slurm itself (`scontrol requeue`).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.deploy_fixtures import (
    FAB,
    REPO,
    SshServer,
    demo_config,
    demo_data,
    demo_reference,
    fab,
    link_data,
    sshd,
)
from tests.lifecycle_helpers import final_model
from tests.slurm_fixtures import SLURM_CONF, slurm, slurm_cluster

__all__ = ["demo_data", "slurm_cluster", "sshd"]  # fixtures used by name below

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ssh,
    pytest.mark.xdist_group("slurm"),  # one worker: the cluster's two nodes are shared
]


def _hosts(sshd: SshServer, tmp_path: Path, **extra: dict[str, Any]) -> Path:
    """``cluster`` (2 nodes x 1 rank) on the test cluster, and ``extra`` entries."""

    def entry(**fields: Any) -> dict[str, Any]:
        base = sshd.host_entry(
            kind="slurm",
            # What a cluster's login shell would set; PYTHONPATH: this checkout's ups.
            remote_env=f"export SLURM_CONF={SLURM_CONF} PYTHONPATH={REPO}",
            poll_s=0.5,
            **fields,
        )
        base.pop("image")
        base.pop("gpus")
        return base

    hosts = {
        "cluster": entry(nodes=2, ranks_per_node=1),
        **{name: entry(**fields) for name, fields in extra.items()},
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"known_hosts": str(tmp_path / "known_hosts"), "hosts": hosts}))
    return path


def _events(log: Path) -> list[dict[str, Any]]:
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _wait(log: Path, timeout: float, count: int = 1, **match: Any) -> float:
    """Wait for ``count`` events with these fields in ``log``; the monotonic time the last
    was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(all(e.get(k) == v for k, v in match.items()) for e in _events(log)) >= count:
            return time.monotonic()
        time.sleep(0.2)  # polling the run's log, bounded by the deadline
    raise AssertionError(f"no {match} in {log} within {timeout} s:\n{log.read_text()[-3000:]}")


def _printed_script(out: str) -> str:
    """The batch script as the deploy plan printed it."""
    block = out.split("  batch script (", 1)[1].split("  node script (", 1)[0]
    return "".join(line[6:] + "\n" for line in block.splitlines()[1:])


def _eval(outcome: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in outcome["metrics"].items() if k.startswith("eval/")}


def test_two_nodes_through_requeue_and_stop_match_one_node(
    slurm_cluster: Path,
    sshd: SshServer,
    demo_data: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """2 nodes x 1 rank: `fab deploy` prints the batch script it submits, preflights both
    nodes inside the allocation and follows the run; the time-limit warning (USR1 to the
    batch shell) mid-run stops it with a checkpoint and it resumes there, under the same
    job (a requeue by Slurm itself, `scontrol requeue`, is the other test's: its script
    resumes the same way); `fab status` names the nodes; `fab stop` preempts it (exit 75)
    and the same `fab deploy` continues it. Its held-out numbers and final weights equal
    the same config's uninterrupted on one machine with two ranks (same global batch)."""
    workdir = sshd.root / "remote"
    link_data(workdir, demo_data)
    hosts = _hosts(sshd, tmp_path)
    # Its own uninterrupted reference: the managed Vast tests that train 30 steps of the
    # demo too (test_failover, test_vast_supervisor) run one rank, this world size is 2.
    plain = demo_config(tmp_path / "plain.yaml", max_steps=30)
    reference_run = demo_reference(tmp_path_factory, plain, demo_data)

    # Held asleep at steps 3 and 6 until stopped: the time-limit warning and the stop land
    # mid-run.
    pauses = [{"kind": "pause", "rank": r, "step": s} for s in (3, 6) for r in (0, 1)]
    paused = demo_config(tmp_path / "paused.yaml", max_steps=30, extra={"faults": pauses})
    deploy = ["deploy", "--host", "cluster", "--hosts-file", str(hosts), "--config", str(paused)]
    log = workdir / "runs" / "pair" / "logs" / "launch.log"
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(FAB), *deploy, "--run", "pair"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first_step = _wait(log, 240, event="train_step", step=0) - started
        _wait(log, 120, event="fault_injected", step=3)
        job_id = (workdir / ".ups" / "deploy" / "pair" / "jobid").read_text().strip()

        status = fab("status", "--host", "cluster", "--hosts-file", str(hosts), timeout=60)
        assert status.returncode == 0, status.stderr
        assert f"slurm job {job_id}: running on n[1-2]" in status.stdout

        # What `--signal=B:USR1@N` sends ahead of the time limit: checkpoint, requeue itself.
        warned_at = time.monotonic()
        assert slurm("scancel", "--signal=USR1", "--batch", job_id).returncode == 0
        resumed = _wait(log, 240, event="resumed") - warned_at
        _wait(log, 120, event="fault_injected", step=6)
        stopped = fab("stop", "--host", "cluster", "--hosts-file", str(hosts), timeout=200)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "preempted (exit 75)" in stopped.stdout
        assert "Logging error" not in stopped.stderr, stopped.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, out[-4000:] + err[-2000:]
    submitted = workdir / ".ups" / "deploy" / "pair" / "run.sh"
    assert _printed_script(out) == submitted.read_text()  # what ran is what was printed
    assert f"submitted run pair as slurm job {job_id}" in out
    assert "preflight_passed_before_launch" in out
    assert f"slurm job {job_id}: requeued 1 time(s), started 2" in out
    assert "pending (None)" not in out and "Logging error" not in err
    # Slurm brings a requeued job back by itself: no "run the same command again" then.
    hints = [e.get("resume", "") for e in _events(log) if e.get("event") == "run_ended"]
    assert hints and all(h.startswith("a requeued Slurm job") for h in hints), hints
    preempted = json.loads((workdir / "runs" / "pair" / "outcome.json").read_text())
    assert preempted["outcome"] == "preempted" and preempted["world_size"] == 2
    # The requeue lost no step: it resumed from the checkpoint written where it was held.
    resumes = [(e["path"], e["step"]) for e in _events(log) if e.get("event") == "resumed"]
    assert resumes == [("runs/pair/checkpoints/step_000004.pt", 4)]

    again = fab(*deploy, "--run", "pair", timeout=300)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    held = preempted["step"]
    assert f"continuing run pair on cluster (it preempted at step {held})" in again.stdout
    new_job = (workdir / ".ups" / "deploy" / "pair" / "jobid").read_text().strip()
    assert new_job != job_id and f"slurm job {new_job}: requeued" not in again.stdout
    outcome = json.loads((workdir / "runs" / "pair" / "outcome.json").read_text())
    assert outcome["outcome"] == "finished" and outcome["resumed_from"]["step"] == held
    reference = json.loads((reference_run / "outcome.json").read_text())
    assert _eval(outcome) and _eval(outcome) == _eval(reference)
    weights, expected = final_model(workdir / "runs" / "pair"), final_model(reference_run)
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), f"{name} differs from the 1-node run"
    assert (workdir / "runs" / "pair" / "nodes" / "1" / "pair" / "logs" / "launch.log").exists()
    print(f"slurm: deploy -> first step {first_step:.1f} s; warning -> resumed {resumed:.1f} s")


def test_unschedulable_request_and_failing_node_preflight(
    slurm_cluster: Path, sshd: SshServer, demo_data: Path, tmp_path: Path
) -> None:
    """A job asking for more nodes than the partition has is reported pending with Slurm's
    reason, cancelled after `max_pending_s` (exit 6); a node whose preflight fails (its run
    directory cannot be made) ends the job before training, the node named (exit 4).
    Then a script (examples/ddp, `--run-file`) on 2 nodes x 1 rank, requeued by Slurm
    after its step-5 checkpoint: both nodes resume from the newest committed checkpoint and
    it runs to the end."""
    workdir = sshd.root / "remote"
    link_data(workdir, demo_data)
    hosts = _hosts(sshd, tmp_path, huge={"nodes": 3, "max_pending_s": 3})
    config = demo_config(tmp_path / "demo.yaml", max_steps=4)
    common = ["--hosts-file", str(hosts), "--config", str(config)]

    pending = fab("deploy", "--host", "huge", *common, "--run", "huge", timeout=120)
    assert pending.returncode == 6, pending.stdout[-3000:] + pending.stderr
    assert re.search(
        r"slurm job \d+ pending \(PartitionNodeLimit\), position 1 in the queue", pending.stdout
    )
    assert "was still pending after 3 s (PartitionNodeLimit), so it was cancelled" in pending.stderr
    job_id = (workdir / ".ups" / "deploy" / "huge" / "jobid").read_text().strip()
    assert "CANCELLED" in slurm("scontrol", "show", "job", job_id).stdout
    down = fab("down", "--host", "huge", "--hosts-file", str(hosts), timeout=60)
    assert down.returncode == 0, down.stderr
    assert f"slurm job {job_id} cancelled (run huge): nothing to cancel" in down.stdout

    # Node 1's run directory (runs/<id>/nodes/1) cannot be created: a file is in its way.
    (workdir / "runs" / "bad" / "nodes").mkdir(parents=True)
    (workdir / "runs" / "bad" / "nodes" / "1").write_text("in the way\n")
    failed = fab("deploy", "--host", "cluster", *common, "--run", "bad", timeout=240)
    assert failed.returncode == 4, failed.stdout[-3000:] + failed.stderr
    assert "preflight on n2 failed:" in failed.stdout
    assert "is not a writable directory on n2" in failed.stdout
    assert "preflight failed on n2" in failed.stderr and "--exclude" in failed.stderr
    assert "failed (exit 4): preflight failed on n2 before training" in failed.stdout
    outcome = json.loads((workdir / "runs" / "bad" / "outcome.json").read_text())
    assert (outcome["outcome"], outcome["cause"], outcome["phase"]) == (
        "failed", "preflight", "preflight",
    )  # fmt: skip
    assert not (workdir / "runs" / "bad" / "logs").exists()  # no training started

    # A script: its workdir synced through the login node, `ups launch --run-file` per node.
    run_file = REPO / "examples" / "ddp" / "ups-run.yaml"
    slow = "--script-args=--steps 10 --save-every 5 --step-s 1"
    script = ["deploy", "--host", "cluster", "--hosts-file", str(hosts), "--run-file"]
    proc = subprocess.Popen(
        [str(FAB), *script, str(run_file), "--run", "ddp", slow], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        checkpoints = workdir / "runs" / "ddp" / "checkpoints"
        deadline = time.monotonic() + 240
        while not (checkpoints / "step_000005.pt").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(proc.communicate())[-4000:]
            time.sleep(0.2)  # polling the shared run directory, bounded by the deadline
        job_id = (workdir / ".ups" / "deploy" / "ddp" / "jobid").read_text().strip()
        assert slurm("scontrol", "requeue", job_id).returncode == 0
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:] + err[-2000:]
    assert "workdir " in out and "file(s) sent" in out  # synced from the login node
    assert f"slurm job {job_id}: requeued 1 time(s), started 2" in out
    outcome = json.loads((workdir / "runs" / "ddp" / "outcome.json").read_text())
    assert outcome["outcome"] == "finished" and outcome["world_size"] == 2, outcome
    # The newest committed when Slurm stopped it: 5, or 6 when the ranks saved on SIGTERM.
    resumed = outcome["resumed_from"]["checkpoint"]
    assert resumed in [str(checkpoints / f"step_00000{s}.pt") for s in (5, 6)], outcome
    node1 = workdir / "runs" / "ddp" / "nodes" / "1" / "ddp" / "outcome.json"
    assert json.loads(node1.read_text())["resumed_from"]["checkpoint"] == resumed
    print(f"slurm script: requeue resumed from {Path(resumed).name}")
