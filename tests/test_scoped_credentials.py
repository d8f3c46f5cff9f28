"""Bucket credentials for a rented host: the session policy (exactly), their lifetime and
renewal schedule, minting them with STS against moto's server mode, the uploader on the
host picking up a renewed credentials file without a restart, waiting out a lapse and
catching up, and the supervisor's renewal over SSH.

moto answers ``GetFederationToken`` and ``AssumeRole`` but enforces no session policy and
no expiry for the credentials it mints (it accepts any key unless its IAM emulation is on,
and even then not a federated user's inline policy), so what the policy allows is checked
here as a document, not against a server; the expiry is enforced by botocore on the
client (``RefreshableCredentials``), which is what these tests drive.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import time
from pathlib import Path

import pytest
import structlog

from tests.deploy_fixtures import SshServer, sshd
from tests.moto_server import MotoServer, moto_server
from ups.backoff import Policy
from ups.bucket import Bucket
from ups.bucket.credentials import RENEWABLE_ENV, Keys, account_keys, parse_file
from ups.bucket.scoped import (
    FEDERATION_MAX_S,
    MARGIN_S,
    MIN_S,
    Access,
    MintRefused,
    keys_for,
    policy_document,
    session_name,
)
from ups.bucket.uploader import Uploader
from ups.deploy.hosts import ContainerHost, HostsFile
from ups.deploy.managed.renewal import Renewal
from ups.deploy.transport.session import Target

__all__ = ["moto_server", "sshd"]  # fixtures used by name below

NOW = 1_800_000_000.0


def test_policy_is_the_runs_prefix_and_nothing_else() -> None:
    """Objects under <prefix>/<run_id>/ (get, put, delete, abort a multipart upload), and a
    listing only with that prefix; a bucket without a prefix scopes to <run_id>/."""
    assert policy_document("s3://bk/team/ups", "r1") == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "RunObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                ],
                "Resource": "arn:aws:s3:::bk/team/ups/r1/*",
            },
            {
                "Sid": "ListRunPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::bk",
                "Condition": {"StringLike": {"s3:prefix": "team/ups/r1/*"}},
            },
        ],
    }
    bare = policy_document("s3://bk", "r2")
    assert bare["Statement"][0]["Resource"] == "arn:aws:s3:::bk/r2/*"
    assert bare["Statement"][1]["Condition"] == {"StringLike": {"s3:prefix": "r2/*"}}
    assert session_name("demo-20261126-010203-abcd/x") == "ups-demo-20261126-010203-abcd-x"[:32]


def test_lifetime_is_the_run_plus_a_margin_within_what_the_store_allows() -> None:
    """Until the deadline plus 30 min, at most 36 h (federation) or 1 h (a role) unless
    asked, never under STS's 15 min; renewed at half the lifetime unless the keys already
    outlive the run."""
    run = Access("scoped", "s3://bk/p", "r1", until=NOW + 4 * 3600)
    assert run.lifetime_s(NOW) == 4 * 3600 + MARGIN_S
    assert Access("scoped", "s3://bk/p", "r1", until=NOW + 99 * 3600).lifetime_s(NOW) == (
        FEDERATION_MAX_S
    )
    assert Access("scoped", "s3://bk/p", "r1", until=NOW - 1500).lifetime_s(NOW) == MIN_S
    role = Access("scoped", "s3://bk/p", "r1", role_arn="arn:aws:iam::1:role/u", until=NOW + 1e5)
    assert role.lifetime_s(NOW) == 3600
    assert Access("scoped", "s3://bk/p", "r1", role_arn="a", hours=6).lifetime_s(NOW) == 6 * 3600
    assert Access("scoped", "s3://bk/p", "r1", hours=0.25).lifetime_s(NOW) == MIN_S

    # Keys that outlive the run are never renewed; others at half their lifetime left.
    assert not run.renew_due(NOW + 4 * 3600 + MARGIN_S, NOW + 3 * 3600)
    assert not role.renew_due(NOW + 3600, NOW + 1000)
    assert role.renew_due(NOW + 3600, NOW + 1801)
    quick = Access("scoped", "s3://bk/p", "r1", hours=0.25, until=NOW + 3600, renew_before_s=890)
    assert not quick.renew_due(NOW + 900, NOW + 5) and quick.renew_due(NOW + 900, NOW + 11)
    assert not Access("account", "s3://bk/p", "r1", until=NOW + 3600).renew_due(NOW, NOW)

    text = run.describe(NOW)
    assert "get/put/delete under s3://bk/p/r1/" in text and "4.50 h" in text
    assert "renewed by the supervisor" in text
    assert "everything they reach" in Access("account", "s3://bk/p", "r1").describe(NOW)


def test_minted_with_sts_from_the_users_keys(moto_server: MotoServer) -> None:
    """GetFederationToken (no role) and AssumeRole (role_arn) against moto's STS on the
    bucket's endpoint: session credentials other than the user's, expiring after the
    asked lifetime; `account` gives the user's own. A store without STS is refused with
    the way out named."""
    url, endpoint = moto_server.url("ups"), moto_server.endpoint_url
    account = account_keys(url)
    assert account.access_key == moto_server.access_key and account.expires is None
    for role in (None, "arn:aws:iam::123456789012:role/ups-uploader"):
        access = Access("scoped", url, "r1", endpoint, role, hours=0.5)
        started = time.time()
        keys = keys_for(access)
        assert keys.token and keys.access_key != moto_server.access_key
        assert keys.secret_key != moto_server.secret_key
        assert keys.expires == pytest.approx(started + 1800, abs=5)
        assert parse_file(keys.file_text(), "f") == Keys(
            keys.access_key, keys.secret_key, keys.token, float(int(keys.expires or 0))
        )
    assert keys_for(Access("account", url, "r1", endpoint)) == account

    nothing = Access("scoped", url, "r1", "http://127.0.0.1:9", hours=0.5)
    with pytest.raises(MintRefused, match="credentials: account to accept that"):
        keys_for(nothing)


def _checkpoint(run_dir: Path, step: int) -> None:
    import hashlib

    ckpts = run_dir / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    path = ckpts / f"step_{step:06d}.pt"
    path.write_bytes(f"weights {step}".encode() * 50)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(digest + "\n")


def _wait(what: str, ok: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)  # the uploader's thread


def test_uploader_picks_up_renewals_and_catches_up_after_a_lapse(
    moto_server: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's uploader reads its credentials from the renewable file: renewed (other
    keys) while checkpoints keep coming, no upload fails; left to expire, a checkpoint
    written meanwhile fails with the expiry named (`cause: credentials_expired`) while the
    writer goes on; renewed, it is uploaded (checkpoint_sync_recovered)."""
    creds = tmp_path / "aws_credentials"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)  # only the file: as on the host
    monkeypatch.setenv(RENEWABLE_ENV, str(creds))

    def renew(name: str, seconds: float) -> None:
        keys = Keys(f"ASIA{name}", f"secret-{name}", f"token-{name}", time.time() + seconds)
        part = creds.with_name("part")
        part.write_text(keys.file_text())
        part.replace(creds)

    renew("FIRST", 60)
    bucket = Bucket.open(moto_server.url("ups"), endpoint_url=moto_server.endpoint_url)
    run_dir = tmp_path / "run"
    quick = Policy("test", first=0.2, factor=1.0, max_s=0.2)
    with structlog.testing.capture_logs() as logs:
        uploader = Uploader(bucket, "r1", run_dir, keep_last=10, policy=quick).start()
        sent: list[int] = []
        for step in range(1, 7):  # a renewal between every two checkpoints
            _checkpoint(run_dir, step)
            uploader.notify()
            renew(f"R{step}", 60)
            sent.append(step)
        report = uploader.flush(30)
        assert report.complete and report.pending == [], report
        assert not [e for e in logs if e["event"] == "checkpoint_sync_failed"]

        renew("SHORT", 1.5)
        time.sleep(2.0)  # the file's credentials expire; nobody renews them
        _checkpoint(run_dir, 7)
        uploader.notify()
        _wait("the lapse named", lambda: any(e["event"] == "checkpoint_sync_failed" for e in logs))
        renew("AFTER", 60)
        report = uploader.flush(30)
        uploader.stop()
    assert report.complete and report.pending == [], report
    failed = [e for e in logs if e["event"] == "checkpoint_sync_failed"]
    assert failed[0]["cause"] == "credentials_expired"
    assert "the bucket credentials expired at" in failed[0]["error"]
    assert any(e["event"] == "checkpoint_sync_recovered" for e in logs)
    assert not [e for e in logs if e["event"] == "checkpoint_sync_stopped"]
    names = bucket.list("r1/checkpoints/")
    assert [n for n in names if n.endswith(".sha256")] == [
        f"r1/checkpoints/step_{s:06d}.pt.sha256" for s in range(1, 8)
    ]
    print(f"\nMEASURE uploads lost across {len(sent)} renewals: 0 of {len(sent)}")
    assert json.loads(json.dumps(report.as_dict()))["error"] is None


@pytest.mark.ssh
@pytest.mark.slow
def test_renewal_replaces_the_hosts_file_and_says_when_it_cannot(
    sshd: SshServer, moto_server: MotoServer, tmp_path: Path
) -> None:
    """The supervisor's renewal over a real SSH connection: it learns the expiry from the
    host's file (as a supervisor that picked up a running instance must), mints new keys
    when less than half their lifetime is left and replaces the file whole, still 0600;
    fresh keys are left alone. A store that stops minting is said, with the time left of
    the host's keys, and the file stays as it was."""
    spec = HostsFile.model_validate({"hosts": {"h": sshd.host_entry()}}).hosts["h"]
    assert isinstance(spec, ContainerHost)
    target = Target(spec=spec, known_hosts=tmp_path / "known_hosts", out=io.StringIO())
    path = sshd.root / "remote" / "aws_credentials"
    path.write_text(Keys("ASIAOLD", "old-secret", "old-token", time.time() + 300).file_text())
    path.chmod(0o600)
    access = Access("scoped", moto_server.url("ups"), "r1", moto_server.endpoint_url,
                    hours=0.25, until=time.time() + 3600)  # fmt: skip
    said: list[str] = []
    renewal = Renewal(target, str(path), access, said.append)
    try:
        assert renewal.once()  # 300 s left of 900: due
        renewed = parse_file(path.read_text(), str(path))
        assert renewed.access_key != "ASIAOLD" and renewed.token
        assert renewed.expires == pytest.approx(time.time() + 900, abs=10)
        assert path.stat().st_mode & 0o777 == 0o600
        assert "renewed the instance's bucket credentials (scoped to s3://" in said[-1]
        assert not renewal.once()  # fresh keys: not due

        before = path.read_text()
        renewal.access = dataclasses.replace(
            access, endpoint_url="http://127.0.0.1:9", renew_before_s=10_000
        )
        renewal.start()
        _wait("the failed renewal said", lambda: "could not renew" in said[-1], timeout=60)
    finally:
        renewal.stop()
    assert re.search(r"could not renew the instance's bucket credentials \(\d+ s left", said[-1])
    assert path.read_text() == before
