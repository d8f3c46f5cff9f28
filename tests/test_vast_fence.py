"""The fence without a check-then-act window, against the FAKE Vast API with real instances:
an instance of the run created under an older lease epoch (as a supervisor frozen between
its lease check and its create would make it, after another took the run over) is ended by
the supervisor holding the run within its bound, and the run record says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from vastai import VastAI

from tests.deploy_fixtures import demo_config, demo_data
from tests.fake_vast import FakeVast, fake_vast
from tests.test_vast_recovery import _deploy, _hosts
from ups.deploy.providers import label_for

__all__ = ["demo_data", "fake_vast"]  # fixtures used by name below

BOUND_S = 15.0
"""monitor_s (1 s here) plus one listing and one destroy, with room for a loaded machine."""


@pytest.mark.slow
@pytest.mark.ssh
def test_a_stale_epoch_instance_is_ended_within_the_bound(
    fake_vast: FakeVast, demo_data: Path, tmp_path: Path
) -> None:
    """While a supervisor holds run 'fence' (epoch 1) and sets up its instance, an instance
    labelled for the run under epoch 0 appears, created through the API as a frozen
    supervisor would: it is destroyed within the bound, never two instances bill past it,
    the record keeps it with its cost and why, and the run finishes on its own instance."""
    hosts = _hosts(fake_vast, tmp_path, demo_data, interruptible=False)
    config = demo_config(tmp_path / "demo.yaml", max_steps=6, nproc=1)
    proc = _deploy(tmp_path, fake_vast, hosts, config, "fence")
    deadline = time.monotonic() + 300
    while not [i for i in fake_vast.live() if (i.root / "disk" / "workspace" / "data").exists()]:
        assert proc.poll() is None and time.monotonic() < deadline, "no instance was set up"
        time.sleep(0.2)  # the supervisor renting and setting up its instance
    (mine,) = fake_vast.live()
    sdk = VastAI(api_key=fake_vast.api_key, server_url=fake_vast.url, retry=1, raw=True)
    created = time.monotonic()
    stray = sdk.create_instance(id=101, image="ups", disk=32, label=label_for("vast", "fence", 0),
                                ssh=True)["new_contract"]  # fmt: skip
    while stray not in fake_vast.destroyed:
        assert time.monotonic() - created < BOUND_S, "the stale instance was not ended in time"
        time.sleep(0.1)  # the supervisor's sweep
    ended_after = time.monotonic() - created
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    assert fake_vast.destroyed[stray].billed_s["running"] < BOUND_S
    assert mine.id in fake_vast.destroyed and fake_vast.live() == []
    assert f"instance {stray} (vast, ups:vast:fence@0): created under lease epoch 0" in out
    record = json.loads((tmp_path / "runs" / "fence" / "run.json").read_text())
    assert record["epoch"] == 1
    assert (record["outcome"]["outcome"], record["outcome"]["exit_code"]) == ("finished", 0)
    (kept,) = [r for r in record["instances"] if r["instance_id"] == str(stray)]
    assert kept["end_reason"].startswith("stray: created under lease epoch 0, older than")
    assert kept["epoch"] == 0 and kept["ended"] is not None
    mine_rec = next(r for r in record["instances"] if r["instance_id"] == str(mine.id))
    assert mine_rec["epoch"] == 1
    print(f"stale instance ended {ended_after:.1f} s after its create")
