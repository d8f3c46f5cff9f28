"""`checkpoint_sync: s3://` on a Vast host: the instance uploads to the bucket itself with
credentials minted for the run (renewed by the supervisor) in a 0600 file, and the
laptop's own S3 keys nowhere there. The FAKE Vast API (tests/fake_vast.py) with real
instances, a real S3 server with STS on loopback (tests/moto_server.py), the real SDKs."""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.deploy_fixtures import FAB, REPO, demo_config, demo_data
from tests.fake_vast import FakeVast, fab_env, fake_vast, write_vast_hosts
from tests.fake_wandb import FakeWandb, fake_wandb
from tests.moto_server import MotoServer, moto_server
from ups.bucket import Bucket, committed_checkpoints
from ups.bucket.credentials import parse_file
from ups.config.schema import Config
from ups.deploy import kinds
from ups.deploy.errors import UsageError
from ups.deploy.hosts import HostsFile
from ups.deploy.managed.rental_plan import rented
from ups.deploy.onhost.plan import DeployPlan, build_plan, build_script_plan
from ups.deploy.providers.vast.options import VastHost
from ups.deploy.request import DeployRequest
from ups.workload import ScriptWorkload

__all__ = ["demo_data", "fake_vast", "fake_wandb", "moto_server"]  # fixtures used by name below


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
def test_instance_uploads_with_minted_keys_renewed_and_the_account_keys_nowhere(
    fake_vast: FakeVast,
    demo_data: Path,
    moto_server: MotoServer,
    fake_wandb: FakeWandb,
    tmp_path: Path,
) -> None:
    """hosts.yaml names a bucket; the laptop has its account keys in its environment and
    AWS_ENDPOINT_URL (moto: S3 and STS). Deploy mints credentials for the run (STS
    GetFederationToken, 15 minutes here, renewed when 895 s are left: every few seconds)
    and writes them in a 0600 file; the supervisor renews them while the instance trains,
    and the instance uploads every checkpoint and the outcome without a failed upload.
    The account key id and secret are in no process's argv or environment on the
    instance, no file there (the 0600 file holds the minted keys), not in the create
    request, the onstart script, fab's output, the run's logs or the bucket.

    W&B as by default (mode auto, a key on the laptop): offline on the instance, the key
    nowhere there, and the run's history synced from the laptop (FAKE W&B server) at the
    end."""
    setup = f"mkdir -p data && ln -sfn {demo_data} data/demo"
    # The instance runs this checkout's ups (the venv's editable install may be another's).
    hosts = write_vast_hosts(
        fake_vast, tmp_path / "hosts.yaml", setup=setup, checkpoint_sync=moto_server.url(),
        remote_env=f"export PYTHONPATH={REPO}",
    )  # fmt: skip
    quick = {"credentials_hours": 0.25, "renew_before_s": 895}
    wandb = {"mode": "auto", "project": "ups"}
    config = demo_config(
        tmp_path / "demo.yaml",
        max_steps=20,
        nproc=1,
        extra={"checkpoint_sync": quick, "wandb": wandb},
    )
    env = fab_env(
        fake_vast, tmp_path, **moto_server.client_env(), AWS_ENDPOINT_URL=moto_server.endpoint_url,
        **fake_wandb.client_env(),
    )  # fmt: skip
    proc = subprocess.Popen(
        [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
         "--config", str(config), "--run", "vast-s3"],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    secret, access = moto_server.secret_key.encode(), moto_server.access_key.encode()
    wandb_key = fake_wandb.api_key.encode()
    leaks: list[str] = []
    try:
        while proc.poll() is None:  # look at the instance's processes while it trains
            for key in (secret, access, wandb_key):
                leaks += _instance_leaks(fake_vast, key)
            time.sleep(0.5)  # sampling another process tree
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert leaks == []
    assert f"bucket:   {moto_server.url()} (checkpoints uploaded from the host" in out
    scope = f"get/put/delete under {moto_server.url()}/vast-s3/, list that prefix only"
    assert f"aws_credentials: minted for this run (GetFederationToken): {scope}" in out
    minted = re.search(r"minted with GetFederationToken in ([0-9.]+) s", out)
    renewals = re.findall(r"renewed the instance's bucket credentials .* in ([0-9.]+) s", out)
    assert minted is not None and len(renewals) >= 1, out[-3000:]
    bucket = Bucket.open(moto_server.url(), endpoint_url=moto_server.endpoint_url)
    assert [r.step for r in committed_checkpoints(bucket, "vast-s3")] == [10, 20]
    remote = json.loads(bucket.get_bytes("vast-s3/outcome.json") or b"{}")
    assert remote["outcome"] == "finished" and remote["checkpoint_sync"]["complete"]
    host_log = (tmp_path / "runs" / "vast-s3" / "logs" / "launch.log").read_text()
    assert "checkpoint_synced" in host_log and "checkpoint_sync_failed" not in host_log
    assert "secrets:  (none)" in out and "W&B:      offline on the instance (no key there)" in out
    started = [json.loads(line) for line in host_log.splitlines() if "wandb_started" in line]
    assert started and started[0]["mode"] == "offline"
    assert "synced the run's W&B directory from this machine (1 offline run(s))" in out
    synced = fake_wandb.runs["vast-s3"]
    assert synced["keys"] == {fake_wandb.api_key}
    assert [row["_step"] for row in synced["history"] if "train/loss" in row] == [0, 5, 10, 15, 19]

    (inst,) = fake_vast.destroyed.values()
    for key in (secret, access, wandb_key):
        assert key.decode() not in json.dumps(inst.row()) + inst.onstart + out + err
    disk = inst.root / "disk"
    creds = disk / "workspace" / ".ups" / "deploy" / "vast-s3" / "aws_credentials"
    assert creds.stat().st_mode & 0o777 == 0o600
    on_host = parse_file(creds.read_text(), str(creds))
    assert on_host.token and on_host.access_key != moto_server.access_key
    assert on_host.expires is not None and on_host.expires > time.time() + 800  # renewed
    for key in (secret, access, wandb_key):
        assert _files_holding(disk, key) == []
        assert _files_holding(tmp_path / "runs", key) == []
    for name in bucket.list(""):
        data = bucket.get_bytes(name) or b""
        assert secret not in data and access not in data, name
    print(
        f"\nMEASURE minting before renting: {float(minted.group(1)):.2f} s; "
        f"{len(renewals)} renewal(s) during the run, each {', '.join(renewals)} s; "
        "uploads failed across them: 0"
    )


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


def test_a_rented_host_gets_scoped_keys_and_no_wandb_key_unless_told(tmp_path: Path) -> None:
    """Your own host: your S3 keys and your W&B key, each listed with what it opens. The
    same plan for a rented host: minted S3 credentials scoped to the run's prefix, living
    until the deadline plus a margin, and no W&B key; `credentials: account` and
    `wandb.online_on_host` send yours. No value is ever in the plan."""
    spec = VastHost(name="v", offer="gpu_name=RTX_4090", max_price_per_hour=1.0)
    env = {"AWS_ACCESS_KEY_ID": "AKIDPLANTEST", "AWS_SECRET_ACCESS_KEY": "plan-secret-value",
           "WANDB_API_KEY": "wandb-key-value"}  # fmt: skip

    def plans(**sections: dict[str, object]) -> tuple[DeployPlan, DeployPlan]:
        data = {"tasks": [{"name": "a", "layout": "single_1d", "path": "a.h5"}], **sections}
        cfg = Config.model_validate(data)
        own = build_plan(spec.as_container("h", None), tmp_path / "c.yaml", cfg=cfg,
                         run_id="r1", env=env)  # fmt: skip
        return own, rented(own, cfg, deadline=time.time() + 3600)

    own, rent = plans(checkpoint_sync={"url": "s3://bk/runs"})
    assert own.secrets == ["WANDB_API_KEY"] and rent.secrets == []
    assert own.bucket_access is not None and own.bucket_access.mode == "account"
    assert rent.bucket_access is not None and rent.bucket_access.mode == "scoped"
    assert rent.bucket_access.lifetime_s(time.time()) == pytest.approx(5400, abs=5)
    mine = own.render()
    assert "WANDB_API_KEY: your W&B account (every project of it), until you revoke it" in mine
    assert "aws_credentials: this machine's own S3 keys: everything they reach" in mine
    theirs = rent.render()
    assert "secrets:  (none)" in theirs and "WANDB_API_KEY" not in theirs
    assert (
        "aws_credentials: minted for this run (GetFederationToken): get/put/delete under "
        "s3://bk/runs/r1/, list that prefix only; expire 1.50 h after minting, renewed by "
        "the supervisor before they expire"
    ) in theirs
    _, told = plans(
        checkpoint_sync={"url": "s3://bk/runs", "credentials": "account"},
        wandb={"online_on_host": True},
    )
    assert told.secrets == ["WANDB_API_KEY"]
    assert told.bucket_access is not None and told.bucket_access.mode == "account"
    for text in (mine, theirs, told.render(), told.to_json()):
        for value in env.values():
            assert value not in text
    # Your own script on a rented host: the run file's bucket, scoped the same way unless
    # its checkpoint_sync says `credentials: account`.
    (tmp_path / "train.py").write_text("print('hi')\n")
    for mode in ("scoped", "account"):
        workload = ScriptWorkload(
            script="train.py",
            workdir=tmp_path,
            checkpoint_sync="s3://bk/runs",
            sync_credentials="account" if mode == "account" else "auto",
        )
        script = build_script_plan(spec.as_container("h", None), workload, run_id="r2", env=env)
        rent = rented(script, None, time.time() + 3600, workload)
        assert rent.bucket_access is not None and rent.bucket_access.mode == mode
        assert rent.bucket_access.prefix_url == "s3://bk/runs/r2/"
        assert (
            rent.run_file is not None and rent.run_file["checkpoint_sync"]["url"] == "s3://bk/runs"
        )
        for value in env.values():
            assert value not in rent.render() + rent.to_json()


def test_a_script_is_refused_detached_on_vast(tmp_path: Path) -> None:
    """A managed Vast run of a script is supervised by the deploy that follows it: `--detach`
    is refused with what to do, before any offer is searched."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = VastHost(name="v", offer="gpu_name=RTX_4090", max_price_per_hour=1.0)
    request = DeployRequest(
        host="v", workload=ScriptWorkload(script="train.py", workdir=tmp_path), follow=False
    )
    with pytest.raises(UsageError, match="Leave out --detach"):
        kinds.of(spec).plan(request, [spec], tmp_path / "known_hosts", io.StringIO())


@pytest.mark.slow
def test_no_credentials_or_no_minting_stops_before_renting(
    fake_vast: FakeVast, tmp_path: Path
) -> None:
    """A bucket in hosts.yaml and no S3 credentials on the laptop: exit 2 with where they
    are looked for. Keys, but a store that mints no scoped credentials (no STS there):
    exit 2 naming `credentials: account`, the account keys never sent. No instance was
    created either time. `--dry-run` with `credentials: account` lists what that sends."""
    hosts = write_vast_hosts(fake_vast, tmp_path / "hosts.yaml", checkpoint_sync="s3://bk/runs")
    config = demo_config(tmp_path / "demo.yaml", max_steps=5, nproc=1)
    nowhere = str(tmp_path / "none")
    env = fab_env(fake_vast, tmp_path, AWS_SHARED_CREDENTIALS_FILE=nowhere,
                  AWS_CONFIG_FILE=nowhere, AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    deploy = [str(FAB), "-r", str(REPO), "deploy", "--host", "vast", "--hosts-file", str(hosts),
              "--config", str(config), "--run", "no-keys"]  # fmt: skip

    def fab(*extra: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*deploy, *extra], cwd=tmp_path, env={**env, **more}, text=True,
                              capture_output=True, timeout=120)  # fmt: skip

    result = fab()
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "checkpoint_sync s3://bk/runs needs S3 credentials on this machine" in result.stderr
    assert "Traceback" not in result.stderr

    keys = {"AWS_ACCESS_KEY_ID": "AKIANOSTSHERE", "AWS_SECRET_ACCESS_KEY": "no-sts-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # fmt: skip
    result = fab(**keys)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "could not mint credentials scoped to s3://bk/runs/no-keys/" in result.stderr
    assert "set checkpoint_sync.credentials: account to accept that" in result.stderr
    assert "Traceback" not in result.stderr
    assert fake_vast.live() == [] and fake_vast.destroyed == {}

    result = fab("--dry-run", "--set", "checkpoint_sync.credentials=account", **keys)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "aws_credentials: this machine's own S3 keys: everything they reach" in result.stdout
    assert "AKIANOSTSHERE" not in result.stdout + result.stderr
    assert fake_vast.live() == []
