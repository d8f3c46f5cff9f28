"""A run survives its Vast instance: outbid or vanished, it comes back on another one and
finishes bit-for-bit; a deterministic failure is not relaunched; past max_recoveries the
deploy stops with exit 8 and nothing billing. FAKE Vast API, real instances (sshd as PID 1
of their own namespace), the real `vastai` SDK.

Every interruption is ordered by a handshake (a file, or a line the deploy prints), never
by timing: the first instance gets a `hang` fault (``.faults`` seeded on its disk, read by
``remote_env``) so its run stops for good at a known step, and the test interrupts it only
once the checkpoint before that step has been synced into the local run directory.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import worker_env
from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data
from tests.fake_vast import FakeVast, fab_env, fake_vast, write_vast_hosts
from tests.s3_server import S3Server, s3_server
from ups.bucket import Bucket
from ups.deploy.managed.watch import RECOVERY_EVENT, LocalLog
from ups.retry import retry_verdict
from ups.train.checkpoint import list_checkpoints, load_checkpoint

__all__ = ["demo_data", "fake_vast", "s3_server"]  # fixtures used by name below

FAST = {"sync_every_s": 1, "monitor_s": 1, "ssh_lost_s": 60, "interruptible": True}


def _hosts(fake: FakeVast, tmp_path: Path, data: Path, **entry: object) -> Path:
    # The instance runs this checkout's ups (the venv's editable install may be another's).
    faults = f'export PYTHONPATH={REPO} UPS_FAULTS="$(cat {fake.workdir}/.faults 2>/dev/null)"'
    return write_vast_hosts(
        fake, tmp_path / "hosts.yaml", setup=f"mkdir -p data && ln -sfn {data} data/demo",
        remote_env=faults, **{**FAST, **entry},
    )  # fmt: skip


def _deploy(
    tmp_path: Path, fake: FakeVast, hosts: Path, config: Path, run: str
) -> subprocess.Popen[str]:
    args = ["deploy", "--host", "vast", "--hosts-file", str(hosts), "--config", str(config),
            "--run", run]  # fmt: skip
    return subprocess.Popen(
        [str(FAB), "-r", str(REPO), *args], cwd=tmp_path, text=True, env=fab_env(fake, tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _wait_file(path: Path, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"deploy ended before {path} appeared:\n{out[-3000:]}{err[-2000:]}"
            )
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)  # the handshake: a file the deploy writes


class _Said:
    """What a running deploy prints, read as it comes (a thread per pipe): a test can wait
    for the deploy to say something, then act, and still gets all of both streams."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=lambda f=f, lines=lines: lines.extend(f), daemon=True)
            for f, lines in ((proc.stdout, self.out), (proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in list(self.out)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGINT)  # Ctrl-C: it destroys what it rented
                out, err = self.communicate(timeout=120)
                raise AssertionError(f"the deploy never said {text!r}:\n{out[-3000:]}{err[-2000:]}")
            time.sleep(0.2)  # the deploy's next line

    def communicate(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return "".join(self.out), "".join(self.err)


def _events(log: Path | list[str], name: str) -> list[dict[str, object]]:
    """The events called ``name`` in a log file (or in its lines)."""
    found = []
    for line in log if isinstance(log, list) else log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _, path = list_checkpoints(run_dir / "checkpoints")[-1]
    model: dict[str, torch.Tensor] = load_checkpoint(path)["model"]
    return model


SCRIPT_RUN = """\
script: train.py
args: [--steps, "40", --save-every, "4", --step-s, "0.3", --out, final.pt]
stop_grace_s: 30
checkpoint_sync: {{url: {url}, endpoint_url: {endpoint}, credentials: account}}
"""


def _pointer(bucket: Bucket, run_id: str) -> str:
    raw = bucket.get_bytes(f"{run_id}/script-latest.json")
    return "" if raw is None else str(json.loads(raw)["name"])


@pytest.mark.slow
@pytest.mark.ssh
def test_outbid_script_run_resumes_from_the_bucket_on_a_new_instance_bit_for_bit(
    fake_vast: FakeVast, s3_server: S3Server, tmp_path: Path
) -> None:
    """Your own script (examples/ddp/train.py) as a managed Vast run with the run file's
    bucket (a real S3 gateway; `credentials: account`, rclone has no STS): its workdir is
    synced to the instance, ups uploads its committed checkpoints; outbid once step 8 is in
    the bucket, a second instance is rented from the next offer, gets the workdir again,
    and its `ups launch` restores the bucket's newest checkpoint as UPS_RESUME (the outcome
    says which); the run's last checkpoint in the bucket holds weights `torch.equal` to an
    uninterrupted run's. Both instances are destroyed; the summary counts them."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text((REPO / "examples" / "ddp" / "train.py").read_text())
    run_file = proj / "ups-run.yaml"
    run_file.write_text(SCRIPT_RUN.format(url=s3_server.url(), endpoint=s3_server.endpoint_url))
    hosts = write_vast_hosts(
        fake_vast, tmp_path / "hosts.yaml", remote_env=f"export PYTHONPATH={REPO}", **FAST
    )
    args = ["deploy", "--host", "vast", "--hosts-file", str(hosts), "--run-file", str(run_file),
            "--run", "outbid"]  # fmt: skip
    proc = subprocess.Popen(
        [str(FAB), "-r", str(REPO), *args], cwd=tmp_path, text=True,
        env=fab_env(fake_vast, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    deadline = time.monotonic() + 300
    while _pointer(bucket, "outbid") < "step_000008.pt":
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"step 8 never reached the bucket:\n{out[-3000:]}{err[-2000:]}")
        time.sleep(0.3)  # the instance's ups launch uploading it
    (first,) = fake_vast.live()
    fake_vast.outbid(first.id)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    assert f"instance {first.id} lost: outbid" in out
    assert "recovery 1/3: resuming run outbid from its newest checkpoint in the bucket" in out
    assert "run summary: run outbid: 2 instance(s) used (" in out and "1 recovery(ies)" in out
    assert fake_vast.live() == [] and len(fake_vast.destroyed) == 2
    second = next(i for i in fake_vast.destroyed.values() if i.id != first.id)
    assert second.offer["id"] != first.offer["id"]  # the outbid machine is taken
    outcome = json.loads((tmp_path / "runs" / "outbid" / "outcome.json").read_text())
    assert outcome["outcome"] == "finished"
    resumed = Path(outcome["resumed_from"]["checkpoint"]).name
    assert resumed >= "step_000008.pt", outcome["resumed_from"]
    assert outcome["resumed_from"]["why"].endswith(
        f"restored from {s3_server.url()}/outbid/checkpoints/{resumed}"
    )
    assert f"training steps {int(resumed[5:11])}..40" in out
    assert _pointer(bucket, "outbid") == "step_000040.pt"
    bucket.download_file("outbid/checkpoints/step_000040.pt", tmp_path / "last.pt")
    mine = torch.load(tmp_path / "last.pt", weights_only=True)["model"]
    ref = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(proj / "train.py"), "--steps", "40", "--save-every", "4", "--out",
         str(tmp_path / "ref.pt")],
        cwd=tmp_path, env=worker_env({"PYTHONPATH": str(REPO), "UPS_CHECKPOINT_DIR":
        str(tmp_path / "ref-ckpts")}), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    theirs = torch.load(tmp_path / "ref.pt", weights_only=True)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.slow
@pytest.mark.ssh
def test_vanished_host_recovers_then_max_recoveries_stops(
    fake_vast: FakeVast, demo_data: Path, tmp_path: Path
) -> None:
    """A host that vanishes from the API with its SSH refusing is replaced: the run has no
    bucket, so the replacement gets the checkpoint synced home (step 10) and the log. When
    the replacement vanishes too and max_recoveries (1) is used up, the deploy exits 8 with
    one paragraph naming the bound and the local checkpoint, and nothing is left billing."""
    fake_vast.offers.append({**fake_vast.offers[0], "id": 105, "machine_id": 1050})
    fake_vast.disk_seeds = [{".faults": "hang@0:15"}, {".faults": "hang@0:15"}]
    hosts = _hosts(fake_vast, tmp_path, demo_data, max_recoveries=1)
    config = demo_config(tmp_path / "demo.yaml", max_steps=20, nproc=1)
    proc = _deploy(tmp_path, fake_vast, hosts, config, "vanish")
    said = _Said(proc)
    ckpts = tmp_path / "runs" / "vanish" / "checkpoints"
    _wait_file(ckpts / "step_000010.pt", proc, timeout=300)
    (first,) = fake_vast.live()
    fake_vast.vanish(first.id)
    # Vanished once the deploy says the checkpoint synced home and the log are on the
    # replacement (the log goes last). Not when the log's bytes are all there: its upload
    # then still confirms the size, and a vanish inside that makes the upload fail (seen).
    said.wait_for("uploaded checkpoint step 10 and the run's log", timeout=300)
    (second,) = [i for i in fake_vast.live() if i.id != first.id]
    there = second.root / "disk" / "workspace" / "runs" / "vanish"
    fake_vast.vanish(second.id)
    out, err = said.communicate(timeout=300)
    assert proc.returncode == 8, out[-4000:] + err[-3000:]
    assert f"instance {first.id} lost: vanished from the provider's API" in out
    assert "recovery 1/1: resuming run vanish from step 10 (" in out, out[-4000:]
    log = tmp_path / "runs" / "vanish" / "logs" / "launch.log"
    # The log it uploaded is on the replacement (which may have added lines since).
    (sent,) = re.findall(r"uploaded checkpoint step 10 and the run's log \((\d+) bytes\)", out)
    assert (there / "logs" / "launch.log").stat().st_size >= int(sent) > 0
    uploaded = (there / "checkpoints" / "step_000010.pt").read_bytes()
    assert uploaded == (ckpts / "step_000010.pt").read_bytes(), "not the checkpoint synced home"
    assert "max_recoveries 1 is used up" in err and "step 10" in err
    assert "Traceback" not in err
    assert re.search(
        r"2 instance\(s\) used \(vast \d+ \$[0-9.]+, vast \d+ \$[0-9.]+\), 1 recovery", out
    )
    assert fake_vast.live() == []
    assert len(_events(log, RECOVERY_EVENT)) == 1


@pytest.mark.slow
@pytest.mark.ssh
def test_deterministic_failure_is_not_relaunched(
    fake_vast: FakeVast, demo_data: Path, tmp_path: Path
) -> None:
    """A non-finite loss (exit 65) is not retried: one instance, destroyed, the run's own exit
    code, and the reason named."""
    fake_vast.disk_seeds = [{".faults": "nan@0:3"}]
    hosts = _hosts(fake_vast, tmp_path, demo_data)
    config = demo_config(tmp_path / "demo.yaml", max_steps=20, nproc=1)
    proc = _deploy(tmp_path, fake_vast, hosts, config, "nan")
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 65, out[-4000:] + err[-3000:]
    assert "run nan is not relaunched: non-finite loss" in out
    assert fake_vast.live() == [] and len(fake_vast.destroyed) == 1
    assert re.search(r"1 instance\(s\) used \(vast \d+ \$[0-9.]+\), 0 recovery", out)


def test_log_cut_and_retry_verdicts(tmp_path: Path) -> None:
    """A recovery moves the log lines of steps past the resumed checkpoint aside (they are
    run again), keeps lines without a step; launcher exit codes classify like outcomes."""
    log = LocalLog(tmp_path / "launch.log")
    lines = [{"event": "start"}, {"event": "train_step", "step": 5},
             {"event": "checkpoint_saved", "step": 10}, {"event": "train_step", "step": 10},
             {"event": "train_step", "step": 12}, {"event": "x"}]  # fmt: skip
    for line in lines:
        log.write((json.dumps(line) + "\n").encode())
    last, moved = log.cut_after(10, tmp_path / "lost.log")
    assert (last, moved) == (12, 3)
    assert [json.loads(x)["event"] for x in log.path.read_text().splitlines()] == [
        "start",
        "train_step",
        "checkpoint_saved",
    ]
    assert len((tmp_path / "lost.log").read_text().splitlines()) == 3
    log.reset()
    log.write(b'{"event": "train_step", "step": 0}\n')
    assert log.cut_after(0, tmp_path / "lost.log") == (0, 1)  # no checkpoint: from step 0
    assert retry_verdict(None, 2) == (False, "invalid config or data, or a refused resume")
    assert retry_verdict(None, 137)[0] is True
    assert retry_verdict(None, 65)[0] is False
