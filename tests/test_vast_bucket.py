"""`checkpoint_sync: s3://` on a Vast host: the instance uploads to the bucket itself, with the
laptop's S3 keys in a 0600 file and nowhere else. The FAKE Vast API (tests/fake_vast.py)
with real instances, a real S3 gateway on loopback (tests/s3_server.py), the real SDKs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data
from tests.fake_vast import FakeVast, fab_env, fake_vast, write_vast_hosts
from tests.s3_server import S3Server, s3_server
from ups.bucket import Bucket, committed_checkpoints
from ups.config.schema import Config
from ups.deploy.hosts import HostsFile, VastHost
from ups.deploy.onhost.plan import build_plan

__all__ = ["demo_data", "fake_vast", "s3_server"]  # fixtures used by name below


def _instance_leaks(fake: FakeVast, secret: bytes) -> list[str]:
    """Instance processes whose argv or environment holds ``secret``."""
    places = []
    for inst in fake.live():
        for pid in fake.namespace_pids(inst):
            try:
                proc = Path("/proc") / str(pid)
                blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            except OSError:
                continue  # ended meanwhile
            if secret in blob:
                places.append(f"pid {pid}: {(proc / 'cmdline').read_bytes()[:120]!r}")
    return places


def _files_holding(root: Path, secret: bytes) -> list[str]:
    return sorted(
        str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink()
        and secret in p.read_bytes()
    )  # fmt: skip


@pytest.mark.ssh
@pytest.mark.slow
def test_instance_uploads_with_keys_only_in_a_0600_file(
    fake_vast: FakeVast, demo_data: Path, s3_server: S3Server, tmp_path: Path
) -> None:
    """hosts.yaml names a bucket; the laptop has the keys in its environment and
    AWS_ENDPOINT_URL. The instance trains and uploads every checkpoint and the outcome;
    its processes, the create request, the onstart script, fab's output and every file of
    the run hold neither key: only the 0600 credentials file does."""
    setup = f"mkdir -p data && ln -sfn {demo_data} data/demo"
    hosts = write_vast_hosts(
        fake_vast, tmp_path / "hosts.yaml", setup=setup, checkpoint_sync=s3_server.url()
    )
    config = demo_config(tmp_path / "demo.yaml", max_steps=20)
    env = fab_env(
        fake_vast, tmp_path, **s3_server.client_env(), AWS_ENDPOINT_URL=s3_server.endpoint_url
    )
    proc = subprocess.Popen(
        [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
         "--config", str(config), "--run", "vast-s3"],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    secret, access = s3_server.secret_key.encode(), s3_server.access_key.encode()
    leaks: list[str] = []
    try:
        while proc.poll() is None:  # look at the instance's processes while it trains
            leaks += _instance_leaks(fake_vast, secret) + _instance_leaks(fake_vast, access)
            time.sleep(0.5)  # sampling another process tree
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert leaks == []
    assert "bucket:   s3://ups-test/runs (checkpoints uploaded from the host" in out
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    assert [r.step for r in committed_checkpoints(bucket, "vast-s3")] == [10, 20]
    remote = json.loads(bucket.get_bytes("vast-s3/outcome.json") or b"{}")
    assert remote["outcome"] == "finished" and remote["checkpoint_sync"]["complete"]

    (inst,) = fake_vast.destroyed.values()
    for key in (secret, access):
        assert key.decode() not in json.dumps(inst.row()) + inst.onstart + out + err
    disk = inst.root / "disk"
    creds = disk / "workspace" / ".ups" / "deploy" / "vast-s3" / "aws_credentials"
    assert creds.stat().st_mode & 0o777 == 0o600
    assert _files_holding(disk, secret) == [str(creds)]
    assert _files_holding(tmp_path / "runs", secret) == []
    assert _files_holding(s3_server.data, secret) == []


def test_plan_names_the_bucket_and_passes_the_endpoint_not_the_keys(tmp_path: Path) -> None:
    """A vast entry may name an s3:// bucket (anything else is refused with the form to
    write); the plan passes the laptop's AWS_ENDPOINT_URL to the run and shows the bucket,
    and no key is anywhere in it."""
    entry = {"kind": "vast", "offer": "gpu_name=RTX_4090", "max_price_per_hour": 1.0}
    spec = HostsFile.model_validate(
        {"hosts": {"v": {**entry, "checkpoint_sync": "s3://bk/runs"}}}
    ).hosts["v"]
    assert spec.checkpoint_sync == "s3://bk/runs"
    with pytest.raises(ValueError, match=r"s3://BUCKET.*or 'local'"):
        HostsFile.model_validate({"hosts": {"v": {**entry, "checkpoint_sync": "bk/runs"}}})
    cfg = Config.model_validate(
        {
            "tasks": [{"name": "a", "layout": "single_1d", "path": "a.h5"}],
            "checkpoint_sync": {"url": "s3://bk/runs"},
        }
    )
    assert isinstance(spec, VastHost)
    host = spec.as_container("h", None)
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDPLANTEST",
        "AWS_SECRET_ACCESS_KEY": "plan-secret-value",
        "AWS_ENDPOINT_URL": "https://acct.r2.example",
    }
    plan = build_plan(host, tmp_path / "c.yaml", cfg=cfg, run_id="r1", env=env)
    assert plan.bucket == "s3://bk/runs"
    assert "checkpoint_sync.endpoint_url=https://acct.r2.example" in plan.launch_argv
    text = plan.render() + plan.to_json()
    assert "bucket:   s3://bk/runs" in text
    assert "AKIDPLANTEST" not in text and "plan-secret-value" not in text


@pytest.mark.slow
def test_no_credentials_stops_before_renting(fake_vast: FakeVast, tmp_path: Path) -> None:
    """A bucket in hosts.yaml and no S3 credentials on the laptop: exit 2 with where they
    are looked for, and no instance was created."""
    hosts = write_vast_hosts(fake_vast, tmp_path / "hosts.yaml", checkpoint_sync="s3://bk/runs")
    config = demo_config(tmp_path / "demo.yaml", max_steps=5)
    nowhere = str(tmp_path / "none")
    env = fab_env(fake_vast, tmp_path, AWS_SHARED_CREDENTIALS_FILE=nowhere,
                  AWS_CONFIG_FILE=nowhere, AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    result = subprocess.run(
        [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
         "--config", str(config), "--run", "no-keys"],
        cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "checkpoint_sync s3://bk/runs needs S3 credentials on this machine" in result.stderr
    assert "Traceback" not in result.stderr
    assert fake_vast.live() == [] and fake_vast.destroyed == {}
