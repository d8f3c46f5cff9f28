"""ups.bucket against a real S3 gateway on loopback (tests/s3_server.py), through boto3:
the store's operations, checkpoints that count only once their commit object exists,
keep_last in the bucket, fetches verified against their digest."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.s3_server import S3Server, s3_server
from ups.bucket import (
    Bucket,
    BucketError,
    BucketUnreachable,
    CheckpointMismatch,
    committed_checkpoints,
    fetch_checkpoint,
    newest_checkpoint,
    parse_url,
)
from ups.bucket.checkpoints import local_checkpoints, prune, upload_checkpoint
from ups.bucket.uploader import final_pass, restore_logs

__all__ = ["s3_server"]  # fixture used by name below


def _pt(directory: Path, step: int, payload: bytes) -> Path:
    """A committed .pt checkpoint as ups.train writes it: the file, then its digest."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:06d}.pt"
    path.write_bytes(payload)
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(payload).hexdigest() + "\n")
    return path


def _dcp(directory: Path, step: int, shards: int = 2) -> Path:
    """A committed sharded checkpoint directory: shard files, meta.pt, then the manifest."""
    path = directory / f"step_{step:06d}.dcp"
    path.mkdir(parents=True)
    files = {f"__{i}_0.distcp": bytes([i, step % 256]) * 1000 for i in range(shards)}
    files[".metadata"] = b"metadata" * 10
    files["meta.pt"] = b"meta" + bytes([step % 256])
    for name, data in files.items():
        (path / name).write_bytes(data)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    (path / "manifest.json").write_text(json.dumps({"files": digests}) + "\n")
    return path


def test_url_names_bucket_and_prefix() -> None:
    """`s3://bucket/a/b` splits into the bucket and the prefix; anything else is refused
    with the form to write."""
    assert parse_url("s3://bk/a/b/") == ("bk", "a/b")
    assert parse_url("s3://bk") == ("bk", "")
    for bad in ("bk/prefix", "https://bk/x", "s3:///x"):
        with pytest.raises(ValueError, match="s3://BUCKET"):
            parse_url(bad)


@pytest.mark.slow
def test_store_round_trip(s3_server: S3Server, tmp_path: Path) -> None:
    """Bytes and files go in and come back; keys are listed relative to the prefix; an
    absent key reads as None; a deleted key is gone; a new host's ranks' logs continue
    the bucket's."""
    bucket = Bucket.open(s3_server.url("p/q"), endpoint_url=s3_server.endpoint_url)
    bucket.put_bytes("r1/outcome.json", b'{"outcome": "finished"}')
    assert bucket.get_bytes("r1/outcome.json") == b'{"outcome": "finished"}'
    assert bucket.get_bytes("r1/missing") is None
    written = bucket.modified("r1/outcome.json")
    assert written is not None and abs(written - time.time()) < 300
    assert bucket.modified("r1/missing") is None  # HEAD answers a bare 404
    src = tmp_path / "big.bin"
    src.write_bytes(bytes(range(256)) * 40_000)
    bucket.upload_file(src, "r1/logs/big.bin")
    assert bucket.list("r1/") == ["r1/logs/big.bin", "r1/outcome.json"]
    assert s3_server.objects() == ["p/q/r1/logs/big.bin", "p/q/r1/outcome.json"]
    digest = bucket.download_file("r1/logs/big.bin", tmp_path / "back" / "big.bin")
    assert (tmp_path / "back" / "big.bin").read_bytes() == src.read_bytes()
    assert digest == hashlib.sha256(src.read_bytes()).hexdigest()
    bucket.delete("r1/outcome.json")
    assert bucket.list("") == ["r1/logs/big.bin"]

    # A run continued on a new host (an empty run directory) takes the ranks' logs so far
    # from the bucket before any rank writes: each continues where the last host's ended,
    # and the next upload keeps it whole. launch.log is the supervisor's to restore; a log
    # the run directory already has is left alone.
    bucket.put_bytes("r1/logs/rank0.jsonl", b'{"step": 1}\n')
    bucket.put_bytes("r1/logs/rank1.jsonl", b'{"step": 1, "rank": 1}\n')
    bucket.put_bytes("r1/logs/launch.log", b"old\n")
    new_host = tmp_path / "new" / "r1"
    (new_host / "logs").mkdir(parents=True)
    (new_host / "logs" / "rank1.jsonl").write_text("mine\n")
    assert restore_logs(bucket, "r1", new_host) == ["rank0.jsonl"]
    with (new_host / "logs" / "rank0.jsonl").open("a") as log:
        log.write('{"step": 2}\n')
    bucket.upload_file(new_host / "logs" / "rank0.jsonl", "r1/logs/rank0.jsonl")
    assert bucket.get_bytes("r1/logs/rank0.jsonl") == b'{"step": 1}\n{"step": 2}\n'
    assert not (new_host / "logs" / "launch.log").exists()
    assert (new_host / "logs" / "rank1.jsonl").read_text() == "mine\n"

    # A script's outputs outside its run directory (script-outputs.json, as ups launch
    # records them) go up with the run's last pass, under outputs/ as fab fetch lays them.
    work = tmp_path / "work"
    (work / "lightning_logs" / "version_0").mkdir(parents=True)
    (work / "lightning_logs" / "version_0" / "metrics.csv").write_text("step,loss\n")
    (work / "snapshot.pt").write_bytes(b"w")
    record = {"workdir": str(work), "paths": ["lightning_logs", "snapshot.pt"], "missing": []}
    (new_host / "script-outputs.json").write_text(json.dumps(record))
    final_pass(bucket, "r1", new_host, 1, timeout=60, script_dir=tmp_path / "none")
    assert {"r1/outputs/lightning_logs/version_0/metrics.csv", "r1/outputs/snapshot.pt"} <= set(
        bucket.list("r1/outputs/")
    )


@pytest.mark.slow
def test_a_checkpoint_counts_only_with_its_digest(s3_server: S3Server, tmp_path: Path) -> None:
    """Data whose digest never arrived (an upload cut short) is not a checkpoint: the newest
    is the last committed one, and fetching it gives the same bytes and digest file."""
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    local = tmp_path / "ckpts"
    assert upload_checkpoint(bucket, "r1", _pt(local, 10, b"ten" * 1000))
    assert not upload_checkpoint(bucket, "r1", local / "step_000010.pt")  # already there
    bucket.upload_file(_pt(local, 20, b"twenty"), "r1/checkpoints/step_000020.pt")  # no digest
    ref = newest_checkpoint(bucket, "r1")
    assert ref is not None and (ref.step, ref.name, ref.format) == (10, "step_000010.pt", "pt")
    got = fetch_checkpoint(bucket, ref, tmp_path / "fetched")
    assert got.read_bytes() == b"ten" * 1000
    assert local_checkpoints(tmp_path / "fetched") == [(10, got)]
    assert newest_checkpoint(bucket, "other-run") is None


@pytest.mark.slow
def test_sharded_checkpoint_round_trip(s3_server: S3Server, tmp_path: Path) -> None:
    """A .dcp directory goes up file by file with its manifest last and comes back whole;
    without the manifest it is not listed."""
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    path = _dcp(tmp_path / "ckpts", 30)
    upload_checkpoint(bucket, "r2", path)
    assert s3_server.objects("runs/r2/checkpoints/step_000030.dcp/")[-1].endswith(
        "meta.pt"
    )  # sorted; manifest.json and the rest are there too
    (ref,) = committed_checkpoints(bucket, "r2")
    assert ref.format == "dcp"
    got = fetch_checkpoint(bucket, ref, tmp_path / "fetched")
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt", "manifest.json"):
        assert (got / name).read_bytes() == (path / name).read_bytes()
    bucket.delete(ref.commit_key)
    assert newest_checkpoint(bucket, "r2") is None


@pytest.mark.slow
def test_fetch_refuses_data_that_does_not_match(s3_server: S3Server, tmp_path: Path) -> None:
    """Data changed in the bucket after its commit: the fetch fails naming the key and
    leaves no checkpoint (nor a temporary file) behind."""
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    upload_checkpoint(bucket, "r3", _pt(tmp_path / "a", 5, b"good"))
    upload_checkpoint(bucket, "r3", _dcp(tmp_path / "a", 6))
    bucket.put_bytes("r3/checkpoints/step_000005.pt", b"evil")
    bucket.put_bytes("r3/checkpoints/step_000006.dcp/meta.pt", b"evil")
    dest = tmp_path / "fetched"
    for ref in committed_checkpoints(bucket, "r3"):
        with pytest.raises(CheckpointMismatch, match=ref.name):
            fetch_checkpoint(bucket, ref, dest)
    assert list(dest.iterdir()) == []


@pytest.mark.slow
def test_prune_keeps_the_newest_and_removes_leftovers(s3_server: S3Server, tmp_path: Path) -> None:
    """keep_last in the bucket: the oldest committed checkpoints go (commit first), and so
    does uncommitted data older than the newest commit; newer uncommitted data (an upload
    in progress) stays."""
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    local = tmp_path / "ckpts"
    for step in (1, 2, 3, 4):
        upload_checkpoint(bucket, "r4", _pt(local, step, bytes([step]) * 100))
    bucket.upload_file(_pt(local, 3, b"x"), "r4/checkpoints/step_000000.pt")  # stale, no digest
    bucket.put_bytes("r4/checkpoints/step_000009.pt", b"in flight")
    removed = prune(bucket, "r4", keep_last=2)
    assert removed == ["step_000001.pt", "step_000002.pt", "step_000000.pt"]
    assert [r.step for r in committed_checkpoints(bucket, "r4")] == [3, 4]
    assert "r4/checkpoints/step_000009.pt" in bucket.list("r4/")


@pytest.mark.slow
def test_unreachable_endpoint_is_named(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped server: the error says which address and that it did not answer, and is
    the retryable kind; a missing bucket and a wrong secret are the other kind, each with
    its fix first (a console line shows only the start)."""
    bucket = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    missing = Bucket.open("s3://no-such-bucket/x", endpoint_url=s3_server.endpoint_url)
    with pytest.raises(BucketError) as caught:
        missing.put_bytes("k", b"v")
    assert not isinstance(caught.value, BucketUnreachable)
    assert str(caught.value).startswith("NoSuchBucket (no such bucket: create it, or fix")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    wrong = Bucket.open(s3_server.url(), endpoint_url=s3_server.endpoint_url)
    with pytest.raises(BucketError) as refused:
        wrong.list("")
    assert not isinstance(refused.value, BucketUnreachable)
    assert str(refused.value).startswith(
        "SignatureDoesNotMatch (the S3 credentials were refused: check AWS_ACCESS_KEY_ID"
    )
    s3_server.stop()
    with pytest.raises(BucketUnreachable, match="s3://ups-test/runs/k: endpoint unreachable"):
        bucket.put_bytes("k", b"v")


@pytest.mark.slow
def test_importing_ups_bucket_imports_neither_torch_nor_boto3() -> None:
    """Deploy and the supervisor import ups.bucket on a laptop: neither library loads
    until a bucket is opened."""
    code = "import ups.bucket, sys; print(sorted({'torch', 'boto3'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
