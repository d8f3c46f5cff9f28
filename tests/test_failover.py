"""A run that never stops training: when its provider has no offer under the cap any more,
the same run continues on the next provider its entry lists, from the bucket. FAKE Vast
and FAKE RunPod (each driven through its real SDK, with real instances and pods), a real
S3 server (rclone), real `ups launch`."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data
from tests.fake_runpod import FakeRunPod, fake_runpod, runpod_entry
from tests.fake_vast import FakeVast, fab_env, fake_vast, vast_entry
from tests.s3_server import S3Server, s3_server
from tests.test_vast_recovery import _final_model, _uninterrupted_run
from ups.bucket import Bucket, committed_checkpoints

__all__ = ["demo_data", "fake_runpod", "fake_vast", "s3_server"]  # fixtures used by name

QUICK = {"sync_every_s": 1, "monitor_s": 1, "ssh_lost_s": 60}


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
    a FAKE RunPod pod (preflight there), resumes from checkpoint 10 in the bucket, and
    finishes with weights `torch.equal` to an uninterrupted run's. The summary and the
    record list both instances with their costs and the reason for the move."""
    fake_vast.disk_seeds = [{".faults": "hang@0:15"}]  # the Vast instance never passes 15
    data = f"mkdir -p data && ln -sfn {demo_data} data/demo"
    faults = f'export PYTHONPATH={REPO} UPS_FAULTS="$(cat {fake_vast.workdir}/.faults 2>/dev/null)"'
    bucket_url = s3_server.url()
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({
        "known_hosts": str(tmp_path / "known_hosts"),
        "hosts": {
            "vast": vast_entry(fake_vast, setup=data, remote_env=faults, interruptible=True,
                               checkpoint_sync=bucket_url, failover=["runpod"], **QUICK),
            "runpod": runpod_entry(fake_runpod, setup=data, remote_env=f"export PYTHONPATH={REPO}",
                                   checkpoint_sync=bucket_url, gpus=0, **QUICK),
        },
    }))  # fmt: skip
    account = {"credentials": "account"}  # rclone mints no scoped credentials (no STS)
    config = demo_config(tmp_path / "demo.yaml", max_steps=20, extra={"checkpoint_sync": account})
    env = fab_env(fake_vast, tmp_path, RUNPOD_API_KEY=fake_runpod.api_key,
                  AWS_ENDPOINT_URL=s3_server.endpoint_url, **s3_server.client_env())  # fmt: skip
    proc = subprocess.Popen(
        [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
         "--config", str(config), "--run", "failover"],
        cwd=tmp_path, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    bucket = Bucket.open(bucket_url, endpoint_url=s3_server.endpoint_url)
    deadline = time.monotonic() + 300
    while 10 not in [r.step for r in committed_checkpoints(bucket, "failover")]:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "checkpoint 10 never reached the bucket"
        time.sleep(0.5)  # the instance's uploader committing it
    (first,) = fake_vast.live()
    with fake_vast.lock:  # every Vast offer now costs more than the cap
        for offer in fake_vast.offers:
            offer["dph_base"], offer["min_bid"] = 50.0, 50.0
    fake_vast.outbid(first.id)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:] + err[-3000:]

    assert "moving run failover from vast to runpod (RunPod): no offer under the cap on vast" in out
    assert fake_vast.live() == [] and first.id in fake_vast.destroyed
    assert fake_runpod.live() == [] and len(fake_runpod.terminated) == 1
    (pod,) = fake_runpod.terminated.values()
    summary = next(ln for ln in out.splitlines() if ln.startswith("run summary: run failover"))
    assert re.search(
        rf"2 instance\(s\) used \(vast {first.id} \$[0-9.]+, runpod {pod.id} \$[0-9.]+\)", summary
    ), summary
    assert "moved from vast to runpod: no offer under the cap on vast" in summary
    record = json.loads((tmp_path / "runs" / "failover" / "run.json").read_text())
    assert [(r["provider"], r["host"]) for r in record["instances"]] == [
        ("vast", "vast"), ("runpod", "runpod")]  # fmt: skip
    assert all(r["ended"] is not None and r["price"] > 0 for r in record["instances"])
    (move,) = record["moves"]
    assert (move["from_host"], move["to_host"]) == ("vast", "runpod")
    assert "no offer under the cap on vast" in move["reason"]
    assert record["outcome"]["outcome"] == "finished"
    launch_log = (tmp_path / "runs" / "failover" / "logs" / "launch.log").read_text()
    steps = [e["step"] for e in map(json.loads, launch_log.splitlines()) if e.get("event") ==
             "train_step"]  # fmt: skip
    assert steps == sorted(set(steps)), "a step logged twice or out of order"

    ref = _uninterrupted_run(tmp_path_factory, config, demo_data)
    mine, theirs = _final_model(tmp_path / "runs" / "failover"), _final_model(ref)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    print(
        f"\nMEASURE no offer under the cap on vast -> first step on runpod: "
        f"{move['first_step_s']:.1f} s"
    )
