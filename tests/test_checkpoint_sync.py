"""checkpoint_sync end to end: two real torchrun ranks (gloo, CPU) upload to a real S3 gateway
on loopback (tests/s3_server.py) through boto3; a run on a "new host" (an empty output
directory) resumes from the bucket bit-exactly; an outage of the bucket never stops
training and nothing half-written counts."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import (
    PYTHON,
    REPO,
    parse_events,
    rank_events,
    torchrun,
    uninterrupted_run,
    worker_env,
)
from tests.launch_helpers import ddp_script_reference
from tests.lifecycle_helpers import final_model
from tests.lifecycle_helpers import run as launch
from tests.s3_server import S3Server, s3_server
from ups.bucket import Bucket, committed_checkpoints, fetch_checkpoint, newest_checkpoint
from ups.bucket.checkpoints import local_checkpoints

__all__ = ["s3_server"]  # fixture used by name below

pytestmark = pytest.mark.slow


NO_WANDB = {"mode": "disabled"}
"""For the runs whose checks are the checkpoints alone: W&B's start (about 2 CPU-s) buys them
nothing. The W&B directory's upload is the first test's (W&B offline, as users run it)."""


def _sync(server: S3Server, **extra: Any) -> dict[str, Any]:
    return {"url": server.url(), "endpoint_url": server.endpoint_url, **extra}


def _bucket(server: S3Server) -> Bucket:
    return Bucket.open(server.url(), endpoint_url=server.endpoint_url)


def _events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in rank_events(run_dir, 0) if e["event"] == name]


def test_uploads_keep_last_and_a_new_host_resumes_bit_exactly(
    s3_server: S3Server,
    make_config: Callable[..., Path],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`ups launch` runs upload each checkpoint with its digest as it is made. A run
    preempted at step 6 or so (its ranks report "preempted": launch exits 75, not torchrun's
    1, and its last line says the same command continues it) whose run directory is then
    lost continues on a "new host"
    from the bucket; at its end the bucket keeps keep_last checkpoints and holds
    outcome.json (saying what was uploaded), the logs (launch.log too) and the W&B
    directory, and its final weights equal the uninterrupted run's exactly."""
    env = s3_server.client_env()
    common = {
        "training": {"max_steps": 12},
        "checkpoint": {"every_steps": 4, "keep_last": 2},
        "checkpoint_sync": _sync(s3_server),
    }
    first = make_config(run={"output_dir": str(tmp_path / "b"), "run_id": "moved"}, **common)
    reference = final_model(uninterrupted_run(tmp_path_factory, first))  # shared (conftest)
    stopped = launch(str(tmp_path), str(first), "--skip-preflight",
                     env={**env, "UPS_FAULTS": "sigterm@0:6"})  # fmt: skip
    assert stopped.returncode == 75, stopped.stdout[-3000:]
    end = parse_events(stopped.stdout)[-1]
    assert (end["event"], end["outcome"]) == ("run_ended", "preempted"), end
    assert "same command" in end["resume"], end
    # The preemption checkpoint (the step the ranks agreed to stop at: torchrun forwards
    # SIGTERM asynchronously), flushed within the stop grace.
    preempted = json.loads((tmp_path / "b" / "moved" / "outcome.json").read_text())
    assert preempted["outcome"] == "preempted" and preempted["checkpoint_sync"]["complete"]
    bucket = _bucket(s3_server)
    at = newest_checkpoint(bucket, "moved")
    assert at is not None and at.step == preempted["step"] >= 6
    synced = _events(tmp_path / "b" / "moved", "checkpoint_synced")
    assert [e["step"] for e in synced] == [4, at.step]  # each as it was made

    # A new host: nothing of the run on disk, the same config and run id.
    second = make_config(run={"output_dir": str(tmp_path / "c"), "run_id": "moved"}, **common)
    resumed = launch(str(tmp_path), str(second), "--skip-preflight", env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    run_dir = tmp_path / "c" / "moved"
    (fetched,) = _events(run_dir, "checkpoint_fetched")
    assert (fetched["checkpoint"], fetched["step"]) == (at.name, at.step)
    assert _events(run_dir, "resumed")[0]["step"] == at.step
    # This host's uploads (its log may also hold the first host's lines, fetched with the run).
    synced = [e for e in _events(run_dir, "checkpoint_synced") if e["step"] > at.step]
    assert [e["step"] for e in synced] == [s for s in (8, 12) if s > at.step]
    assert all(e["lag_s"] >= 0 for e in synced)

    assert [r.name for r in committed_checkpoints(bucket, "moved")] == [
        "step_000008.pt",
        "step_000012.pt",
    ]
    assert s3_server.objects("runs/moved/checkpoints/") == [
        "runs/moved/checkpoints/step_000008.pt",
        "runs/moved/checkpoints/step_000008.pt.sha256",
        "runs/moved/checkpoints/step_000012.pt",
        "runs/moved/checkpoints/step_000012.pt.sha256",
    ]
    remote = json.loads(bucket.get_bytes("moved/outcome.json") or b"{}")
    assert remote["outcome"] == "finished"
    assert remote["checkpoint_sync"]["complete"] is True
    assert remote["checkpoint_sync"]["pending"] == []
    assert remote["checkpoint_sync"]["uploaded"][-1] == "step_000012.pt"
    keys = bucket.list("moved/")
    assert {"moved/logs/rank0.jsonl", "moved/logs/rank1.jsonl", "moved/logs/launch.log"} <= set(
        keys
    )
    assert any(k.startswith("moved/wandb/") and k.endswith(".wandb") for k in keys)

    weights = final_model(run_dir)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), f"{name} differs after resume from the bucket"


def test_sharded_checkpoints_go_up_with_their_manifest_last(
    s3_server: S3Server, make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """Under fsdp each .dcp directory reaches the bucket whole (every shard, meta.pt and the
    manifest); fetched back it holds the same bytes as the run directory's."""
    cfg = make_config(
        training={"max_steps": 8, "strategy": "fsdp"},
        run={"output_dir": str(tmp_path / "a"), "run_id": "sharded"},
        checkpoint={"every_steps": 4, "keep_last": 2},
        checkpoint_sync=_sync(s3_server),
        wandb=NO_WANDB,
    )
    done = torchrun(cfg, env=s3_server.client_env())
    assert done.returncode == 0, done.stderr[-3000:]
    bucket = _bucket(s3_server)
    refs = committed_checkpoints(bucket, "sharded")
    assert [(r.name, r.format) for r in refs] == [
        ("step_000004.dcp", "dcp"),
        ("step_000008.dcp", "dcp"),
    ]
    local = tmp_path / "a" / "sharded" / "checkpoints" / "step_000008.dcp"
    got = fetch_checkpoint(bucket, refs[-1], tmp_path / "fetched")
    names = sorted(p.name for p in local.iterdir())
    assert names == sorted(p.name for p in got.iterdir())
    assert {"manifest.json", "meta.pt", ".metadata"} <= set(names)
    for name in names:
        assert (got / name).read_bytes() == (local / name).read_bytes(), name


def _wait(run_dir: Path, proc: subprocess.Popen[str], timeout: float, check: Any) -> None:
    """Poll rank 0's log (another process writes it) until ``check(events)`` holds."""
    deadline = time.monotonic() + timeout
    log = run_dir / "logs" / "rank0.jsonl"
    while time.monotonic() < deadline:
        if log.exists() and check(parse_events(log.read_text())):
            return
        assert proc.poll() is None, "the run ended early"
        time.sleep(0.2)
    raise AssertionError(f"not seen in {log} within {timeout} s")


def _named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_an_unreachable_bucket_never_stops_training_and_uploads_catch_up(
    s3_server: S3Server, make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """The gateway is stopped after the first upload: training goes on writing checkpoints,
    the uploader says the bucket is unreachable; started again on the same port, the
    uploads catch up. Stopped with SIGTERM, the run's outcome says every checkpoint is in
    the bucket, which holds keep_last committed checkpoints that all verify, and the
    leftover of an upload cut short (data, no digest) is never taken and is removed."""
    cfg = make_config(
        training={"max_steps": 100_000},
        run={"output_dir": str(tmp_path / "runs"), "run_id": "outage"},
        checkpoint={"every_steps": 5, "keep_last": 2},
        checkpoint_sync=_sync(s3_server),
        wandb=NO_WANDB,
    )
    run_dir = tmp_path / "runs" / "outage"
    cmd = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "--monitor-interval=0.2", "-m", "ups.train.main", str(cfg),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=worker_env(s3_server.client_env()), text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait(run_dir, proc, 180, lambda ev: _named(ev, "checkpoint_synced"))
        s3_server.stop()
        bucket_down_at = len(_named(parse_events((run_dir / "logs/rank0.jsonl").read_text()),
                                    "checkpoint_saved"))  # fmt: skip
        _wait(run_dir, proc, 120, lambda ev: _named(ev, "checkpoint_sync_failed"))
        # Training goes on: three more checkpoints while the bucket is away.
        _wait(run_dir, proc, 120,
              lambda ev: len(_named(ev, "checkpoint_saved")) >= bucket_down_at + 3)  # fmt: skip
        s3_server.start()
        bucket = _bucket(s3_server)
        bucket.put_bytes("outage/checkpoints/step_000001.pt", b"cut short")  # no digest
        _wait(run_dir, proc, 120, lambda ev: _named(ev, "checkpoint_sync_recovered"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "preempted"
    sync = outcome["checkpoint_sync"]
    assert sync["complete"] is True and sync["pending"] == [], sync
    local = [p.name for _, p in local_checkpoints(run_dir / "checkpoints")]
    refs = committed_checkpoints(bucket, "outage")
    assert [r.name for r in refs] == local and len(local) == 2
    assert refs[-1].step == outcome["step"]
    for ref in refs:  # every committed checkpoint is whole
        fetch_checkpoint(bucket, ref, tmp_path / "verify")
    assert "outage/checkpoints/step_000001.pt" not in bucket.list("outage/")
    events = rank_events(run_dir, 0)
    failed = _named(events, "checkpoint_sync_failed")[0]
    assert "endpoint unreachable" in failed["error"] and failed["retry_in_s"] > 0


def _launch_script(run_file: Path, out_dir: Path, run_id: str, *args: str) -> subprocess.Popen[str]:
    argv = [PYTHON, "-m", "ups", "launch", "--run-file", str(run_file), "--run-id", run_id]
    argv += ["--output-dir", str(out_dir), "--skip-preflight", "--", *args]
    env = worker_env({"PYTHONPATH": str(REPO)})
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _pointer(bucket: Bucket, run_id: str) -> str | None:
    raw = bucket.get_bytes(f"{run_id}/script-latest.json")
    return None if raw is None else str(json.loads(raw)["name"])


SCRIPT_STEPS = 10
"""The script test's steps: the shared plain-DDP reference of that many steps is its
uninterrupted run (tests.launch_helpers.ddp_script_reference, also test_script_recipes')."""


def test_a_script_checkpoint_goes_up_and_a_new_host_resumes_from_it(
    s3_server: S3Server, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A script run (examples/ddp/train.py) with the run file's checkpoint_sync: ups, not the
    script, uploads its newest committed checkpoint while it runs; preempted (SIGTERM, exit
    75) it commits step 6, which the last pass uploads; the same run id on a new host (an
    empty output directory) gets step 6 restored from the bucket as UPS_RESUME, says so in
    the outcome, uploads the checkpoint of its last step, and ends with weights torch.equal
    to an uninterrupted run's (the shared reference: saving every 5 steps, not 4, and
    uploading change nothing computed)."""
    whole = ddp_script_reference(tmp_path_factory, SCRIPT_STEPS)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text((REPO / "examples" / "ddp" / "train.py").read_text())
    sync = f"checkpoint_sync: {{url: {s3_server.url()}, endpoint_url: {s3_server.endpoint_url}}}"
    run_file = proj / "ups-run.yaml"
    run_file.write_text(f"script: train.py\nstop_grace_s: 30\n{sync}\n")
    args = ["--steps", str(SCRIPT_STEPS), "--save-every", "5"]
    bucket = _bucket(s3_server)

    held = _launch_script(
        run_file, tmp_path / "host1", "moved", *args, "--out", str(tmp_path / "moved.pt"),
        "--pause-at", "6",
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while _pointer(bucket, "moved") != "step_000005.pt":  # uploaded while the script runs
        assert held.poll() is None and time.monotonic() < deadline, held.communicate()
        time.sleep(0.3)
    held.send_signal(signal.SIGTERM)
    out, err = held.communicate(timeout=120)
    assert held.returncode == 75, out[-3000:] + err[-2000:]
    assert _pointer(bucket, "moved") == "step_000006.pt"

    moved = str(tmp_path / "moved.pt")
    again = _launch_script(run_file, tmp_path / "host2", "moved", *args, "--out", moved)
    out, err = again.communicate(timeout=180)
    assert again.returncode == 0, out[-3000:] + err[-2000:]
    assert f"training steps 6..{SCRIPT_STEPS}" in out
    restored = tmp_path / "host2" / "moved" / "checkpoints" / "step_000006.pt"
    outcome = json.loads((tmp_path / "host2" / "moved" / "outcome.json").read_text())
    assert outcome["resumed_from"]["checkpoint"] == str(restored)
    assert (
        f"restored from {s3_server.url()}/moved/checkpoints/step_000006.pt"
        in (outcome["resumed_from"]["why"])
    )
    assert _pointer(bucket, "moved") == f"step_{SCRIPT_STEPS:06d}.pt"  # its last step's
    mine = torch.load(tmp_path / "moved.pt", weights_only=True)
    assert mine.keys() == whole.keys() and all(torch.equal(mine[k], whole[k]) for k in whole), (
        "the script resumed from the bucket ends with weights other than the uninterrupted run's"
    )
