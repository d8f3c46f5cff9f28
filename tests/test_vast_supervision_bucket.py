"""The supervisor's side of the run's bucket, against a real S3 gateway on loopback
(rclone serve s3, tests/s3_server.py) through boto3: the state mirrored after every
change, the lease held there for supervisors on other machines, the bucket's newer
checkpoint fetched home before a recovery, an outage that never stops supervision."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.s3_server import S3Server, s3_server
from ups.bucket import Bucket
from ups.bucket.checkpoints import upload_checkpoint
from ups.deploy.managed import record as supervision
from ups.deploy.managed import store as bucket_state
from ups.deploy.managed.lease import Lease, LeaseHeld

__all__ = ["s3_server"]  # fixture used by name below

pytestmark = pytest.mark.slow


def _bucket(server: S3Server) -> Bucket:
    return Bucket.open(server.url("runs"), endpoint_url=server.endpoint_url)


def _checkpoint(directory: Path, step: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:06d}.pt"
    path.write_bytes(f"weights at {step}".encode() * 100)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(digest + "\n")
    return path


def test_state_and_lease_live_in_the_bucket_too(s3_server: S3Server, tmp_path: Path) -> None:
    """Every save lands in <run>/run.json; a supervisor with another run directory
    (another machine) is refused while the first holds the bucket's lease, and takes it
    once released; a bucket that is down leaves supervision going on locally."""
    bucket = _bucket(s3_server)
    said: list[str] = []
    state = supervision.State(run_id="r1", host="vast", config="/c", hosts_file=None, overrides=[])
    sup = supervision.Supervision(
        tmp_path / "a" / "r1" / supervision.FILE,
        state,
        bucket_state.mirror(bucket, "r1", said.append),
    )
    sup.rented("7001", "101", "1010", 0.5, provider="vast", host="vast", epoch=1)
    remote = bucket.get_bytes("r1/run.json")
    assert remote is not None and remote == sup.path.read_bytes()
    assert json.loads(remote)["instances"][0]["machine_id"] == "1010"

    first = Lease(tmp_path / "a" / "r1", "r1", "detached", bucket)
    first.take("fab logs --host vast --run r1")
    elsewhere = Lease(tmp_path / "b" / "r1", "r1", "following", bucket)
    with pytest.raises(LeaseHeld, match="already supervised by the detached supervisor"):
        elsewhere.take("fab logs --host vast --run r1")
    assert not (tmp_path / "b" / "r1" / "supervisor.lease").exists()  # refused: nothing kept
    first.release()
    assert bucket.get_bytes("r1/supervisor.lease") is None
    elsewhere.take("x")
    s3_server.stop()
    sup.synced(10)  # the bucket is down: said once, kept locally
    assert "not written to the bucket this time" in said[-1]
    assert json.loads(sup.path.read_text())["checkpoints"][0]["step"] == 10
    elsewhere.release()


def test_a_newer_bucket_checkpoint_is_fetched_before_a_recovery(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The instance uploaded step 20, only step 10 was synced home over SSH: step 20 comes
    home, verified against its digest; with step 20 already here nothing is fetched."""
    bucket = _bucket(s3_server)
    upload_checkpoint(bucket, "r1", _checkpoint(tmp_path / "instance", 20))
    home = tmp_path / "home" / "checkpoints"
    _checkpoint(home, 10)
    said: list[str] = []
    bucket_state.fetch_newer(bucket, "r1", home, said.append)
    fetched = home / "step_000020.pt"
    assert fetched.read_bytes() == (tmp_path / "instance" / "step_000020.pt").read_bytes()
    assert (home / "step_000020.pt.sha256").exists()
    where = bucket.url_of("r1/checkpoints/step_000020.pt")
    assert said == [f"fetched checkpoint step 20 from {where} to {fetched}"]
    bucket_state.fetch_newer(bucket, "r1", home, said.append)
    assert len(said) == 1


def test_instances_names_the_newest_bucket_checkpoint_and_its_age(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """`fab instances`' line for a run with a bucket: its newest committed checkpoint there
    and how long ago it was committed."""
    from tests.deploy_fixtures import REPO
    from ups.deploy.managed.ops import describe_runs

    bucket = _bucket(s3_server)
    overrides = [f"checkpoint_sync.url={s3_server.url('runs')}",
                 f"checkpoint_sync.endpoint_url={s3_server.endpoint_url}"]  # fmt: skip
    state = supervision.State(
        run_id="r1", host="vast", config=str(REPO / "configs" / "demo.yaml"), hosts_file=None,
        overrides=overrides,
    )  # fmt: skip
    runs = tmp_path / "runs"
    supervision.Supervision(runs / "r1" / supervision.FILE, state).save()
    assert f"{bucket.url_of('r1')}: no checkpoint" in describe_runs([state], runs)
    upload_checkpoint(bucket, "r1", _checkpoint(tmp_path / "instance", 30))
    line = describe_runs([state], runs).splitlines()[-1]
    age = re.search(rf"{re.escape(bucket.url_of('r1'))}: step 30, (\d+) s ago", line)
    assert age is not None and int(age.group(1)) < 120, line


def test_logs_of_a_run_whose_instance_is_gone_come_from_the_bucket(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fab logs --run ID` with no instance left: the log the instance uploaded to the run's
    bucket (named in the run config), rendered; on a machine without the run directory, the
    bucket of the hosts.yaml entry (and the exit code from the supervision state there);
    without a bucket copy, the local one."""
    import io

    from tests.deploy_fixtures import REPO
    from ups.deploy.managed.ops import saved_log
    from ups.deploy.providers.vast.options import VastHost

    spec = VastHost(name="vast", offer="num_gpus=1", max_price_per_hour=1.0)

    bucket = _bucket(s3_server)
    overrides = [f"checkpoint_sync.url={s3_server.url('runs')}",
                 f"checkpoint_sync.endpoint_url={s3_server.endpoint_url}"]  # fmt: skip
    state = supervision.State(
        run_id="r1", host="vast", config=str(REPO / "configs" / "demo.yaml"), hosts_file=None,
        overrides=overrides, exit_code=0,
    )  # fmt: skip
    runs = tmp_path / "runs"
    supervision.Supervision(runs / "r1" / supervision.FILE, state).save()
    assert saved_log("r2", spec, runs) is None  # nothing known of r2: the plain error stands
    line = {"event": "train_step", "step": 7, "train/loss": 0.5, "level": "info"}
    bucket.put_bytes("r1/logs/launch.log", (json.dumps(line) + "\n").encode())
    replay = saved_log("r1", spec, runs)
    assert replay is not None
    out = io.StringIO()
    assert replay(out) == 0
    text = out.getvalue()
    assert f"its log as saved in {bucket.url_of('r1/logs/launch.log')}" in text
    assert "train_step" in text and "step=7" in text and "{" not in text

    elsewhere = tmp_path / "other-laptop" / "runs"  # no run directory: the entry's bucket
    ended = dataclasses.replace(state, exit_code=3)
    bucket.put_bytes(f"r1/{supervision.FILE}", json.dumps(dataclasses.asdict(ended)).encode())
    assert saved_log("r1", spec, elsewhere) is None  # the entry names no bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    with_bucket = spec.model_copy(update={"checkpoint_sync": s3_server.url("runs")})
    replay = saved_log("r1", with_bucket, elsewhere)
    assert replay is not None
    out = io.StringIO()
    assert replay(out) == 3
    assert "step=7" in out.getvalue()
    bucket.delete("r1/logs/launch.log")
    (runs / "r1" / "logs").mkdir()
    (runs / "r1" / "logs" / "launch.log").write_text("plain line\n")
    out = io.StringIO()
    replay = saved_log("r1", spec, runs)
    assert replay is not None and replay(out) == 0
    assert f"saved in {runs / 'r1' / 'logs' / 'launch.log'}:\nplain line" in out.getvalue()
