"""A run that never stops training: when its provider has no offer under the cap any more,
the same run continues on the next provider its entry lists, from the bucket; a spot pod
there interrupted, it continues on that provider's next pod. FAKE Vast
and FAKE RunPod (each driven through its real SDK, with real instances and pods), a real
S3 server (rclone), real `ups launch`."""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data, demo_reference
from tests.fake_runpod import FakeRunPod, fake_runpod, runpod_entry
from tests.fake_vast import FakeVast, fab_env, fake_vast, vast_entry
from tests.s3_server import S3Server, s3_server
from tests.test_vast_recovery import _final_model
from ups.bucket import Bucket, committed_checkpoints
from ups.deploy.managed.watch import RECOVERY_EVENT

__all__ = ["demo_data", "fake_runpod", "fake_vast", "s3_server"]  # fixtures used by name

QUICK = {"sync_every_s": 1, "monitor_s": 1, "ssh_lost_s": 60}


def _faults_at(workdir: Path) -> str:
    """The entry's remote_env: ups from this checkout, and the faults seeded on the disk."""
    return f'export PYTHONPATH={REPO} UPS_FAULTS="$(cat {workdir}/.faults 2>/dev/null)"'


def _wait_committed(bucket: Bucket, proc: subprocess.Popen[str], step: int) -> None:
    deadline = time.monotonic() + 300
    while step not in [r.step for r in committed_checkpoints(bucket, "failover")]:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, f"checkpoint {step} never reached the bucket"
        time.sleep(0.5)  # the instance's uploader committing it


def _first_step_after(launch_log: list[dict[str, Any]], recovery: int) -> dict[str, Any]:
    """The run's first event of training after its recovery number ``recovery``."""
    i = next(i for i, e in enumerate(launch_log) if e.get("event") == RECOVERY_EVENT
             and e.get("recovery") == recovery)  # fmt: skip
    return next(e for e in launch_log[i:] if e.get("event") in ("resumed", "train_step"))


@pytest.mark.slow
@pytest.mark.ssh
def test_no_vast_offer_under_the_cap_moves_the_run_to_runpod_from_the_bucket(
    fake_vast: FakeVast,
    fake_runpod: FakeRunPod,
    demo_data: Path,
    s3_server: S3Server,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Mid-run, FAKE Vast withdraws every offer under the cap and takes the run's instance
    back (outbid). The run's entry lists `failover: [runpod]`: the same run id continues on
    a FAKE RunPod spot pod (preflight there) from checkpoint 10 in the bucket. Once
    checkpoint 20 is committed, RunPod interrupts that pod (SIGTERM, 5 s, gone): the run
    recovers on a new pod of the same provider (Vast still has no offer under the cap),
    resumes from the bucket, and finishes with weights `torch.equal` to an uninterrupted
    run's. The summary and the record list all three instances with their costs and the
    reason for each move."""
    fake_vast.disk_seeds = [{".faults": "hang@0:15"}]  # the Vast instance never passes 15
    fake_runpod.disk_seeds = [{".faults": "hang@0:25"}]  # nor the first pod 25 (not the next)
    data = f"mkdir -p data && ln -sfn {demo_data} data/demo"
    bucket_url = s3_server.url()
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({
        "known_hosts": str(tmp_path / "known_hosts"),
        "hosts": {
            "vast": vast_entry(fake_vast, setup=data, remote_env=_faults_at(fake_vast.workdir),
                               interruptible=True, checkpoint_sync=bucket_url,
                               failover=["runpod"], **QUICK),
            "runpod": runpod_entry(fake_runpod, setup=data,
                                   remote_env=_faults_at(fake_runpod.workdir), interruptible=True,
                                   checkpoint_sync=bucket_url, gpus=0, **QUICK),
        },
    }))  # fmt: skip
    account = {"credentials": "account"}  # rclone mints no scoped credentials (no STS)
    # test_vast_supervisor's bucket recovery trains this config too: one reference for both.
    config = demo_config(
        tmp_path / "demo.yaml", max_steps=30, nproc=1, extra={"checkpoint_sync": account}
    )
    env = fab_env(fake_vast, tmp_path, RUNPOD_API_KEY=fake_runpod.api_key,
                  AWS_ENDPOINT_URL=s3_server.endpoint_url, **s3_server.client_env())  # fmt: skip
    proc = subprocess.Popen(
        [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
         "--config", str(config), "--run", "failover"],
        cwd=tmp_path, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    bucket = Bucket.open(bucket_url, endpoint_url=s3_server.endpoint_url)
    _wait_committed(bucket, proc, 10)
    (first,) = fake_vast.live()
    with fake_vast.lock:  # every Vast offer now costs more than the cap
        for offer in fake_vast.offers:
            offer["dph_base"], offer["min_bid"] = 50.0, 50.0
    fake_vast.outbid(first.id)
    _wait_committed(bucket, proc, 20)
    (pod,) = fake_runpod.live()
    preempted_at = time.time()
    fake_runpod.preempt(pod.id)  # SIGTERM, RunPod's 5 s warning, gone: listed EXITED
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:] + err[-3000:]

    assert "moving run failover from vast to runpod (RunPod): no offer under the cap on vast" in out
    preflights = [out.count(f"remote preflight on {host}:") for host in ("vast", "runpod")]
    assert preflights == [1, 2], f"preflight on vast, on runpod: {preflights}"
    assert f"instance {pod.id} lost: outbid" in out
    assert fake_vast.live() == [] and first.id in fake_vast.destroyed
    assert fake_runpod.live() == [] and len(fake_runpod.terminated) == 2
    (second,) = [p for p in fake_runpod.terminated.values() if p.id != pod.id]
    assert pod.preempted and pod.id in fake_runpod.terminated
    summary = next(ln for ln in out.splitlines() if ln.startswith("run summary: run failover"))
    assert re.search(
        rf"3 instance\(s\) used \(vast {first.id} \$[0-9.]+, runpod {pod.id} \$[0-9.]+, "
        rf"runpod {second.id} \$[0-9.]+\), 2 recovery\(ies\)",
        summary,
    ), summary
    assert "moved from vast to runpod: no offer under the cap on vast" in summary
    record = json.loads((tmp_path / "runs" / "failover" / "run.json").read_text())
    assert [(r["provider"], r["host"], r["instance_id"]) for r in record["instances"]] == [
        ("vast", "vast", str(first.id)), ("runpod", "runpod", pod.id),
        ("runpod", "runpod", second.id)]  # fmt: skip
    assert all(r["ended"] is not None and r["price"] > 0 for r in record["instances"])
    (move,) = record["moves"]  # the second recovery stays on RunPod: no move between providers
    assert (move["from_host"], move["to_host"]) == ("vast", "runpod")
    assert "no offer under the cap on vast" in move["reason"]
    lost_vast, lost_pod = record["history"]
    assert (lost_vast["lost_instance"], lost_vast["resume_step"]) == (str(first.id), 10)
    # From the bucket's newest: 20, or the checkpoint the SIGTERM made in the 5 s warning:
    # at most 25, where the pod's rank hangs before that step's work (a stop agreed at the
    # boundary of step 25 writes checkpoint 25: seen on this machine, it failed the old "< 25").
    assert lost_pod["lost_instance"] == pod.id and 20 <= lost_pod["resume_step"] <= 25
    assert lost_pod["reason"] == "outbid (the provider took it back)"
    assert record["instances"][1]["end_reason"] == f"lost: {lost_pod['reason']}"
    assert record["outcome"]["outcome"] == "finished"
    launch_log = (tmp_path / "runs" / "failover" / "logs" / "launch.log").read_text()
    # ups's events, without torchrun's own warnings of the SIGTERM (plain lines)
    events = [json.loads(ln) for ln in launch_log.splitlines() if ln.startswith("{")]
    steps = [e["step"] for e in events if e.get("event") == "train_step"]
    assert steps == sorted(set(steps)) and steps[-1] == 29, "a step logged twice or out of order"
    on_next_pod = _first_step_after(events, 2)
    assert (on_next_pod["event"], on_next_pod["step"]) == ("resumed", lost_pod["resume_step"])

    ref = demo_reference(tmp_path_factory, config, demo_data)
    mine, theirs = _final_model(tmp_path / "runs" / "failover"), _final_model(ref)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    print(
        f"\nMEASURE no offer under the cap on vast -> first step on runpod: "
        f"{move['first_step_s']:.1f} s"
        f"\nMEASURE runpod spot pod preempted -> first step on the next pod: "
        f"{datetime.fromisoformat(on_next_pod['timestamp']).timestamp() - preempted_at:.1f} s"
    )
