"""Checkpoints in a bucket: the same two formats as on disk, committed by one object written last.

Layout under the bucket prefix (the run directory's, minus what only the host needs)::

    <run_id>/checkpoints/step_000100.pt            the checkpoint (``training.strategy: ddp``)
    <run_id>/checkpoints/step_000100.pt.sha256     its digest: written last, the commit
    <run_id>/checkpoints/step_000200.dcp/...       a sharded checkpoint's files (``fsdp``)
    <run_id>/checkpoints/step_000200.dcp/manifest.json   their digests: written last
    <run_id>/outcome.json, <run_id>/logs/..., <run_id>/wandb/...

S3 has no rename, so an upload cut short leaves data without its digest or manifest: it
is never listed as a checkpoint, and the next upload of that step (or pruning) replaces
or removes it. Deleting goes the other way: the commit object first, then the data.
Nothing here imports torch: the files are moved and checked by their SHA-256 only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ups.bucket.store import Bucket, BucketError
from ups.fsio import atomic_write_bytes, fsync_dir

DIGEST_SUFFIX = ".sha256"
MANIFEST = "manifest.json"
_PT = re.compile(r"^step_(\d+)\.pt$")
_DCP = re.compile(r"^step_(\d+)\.dcp$")
_COMMIT = re.compile(r"^(step_(\d+)\.(?:pt\.sha256|dcp/manifest\.json))$")
_DATA = re.compile(r"^(step_(\d+)\.(?:pt|dcp))(?:/.*)?$")


class CheckpointMismatch(BucketError):
    """A fetched file does not match the digest committed with it."""


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A committed checkpoint in the bucket."""

    run_id: str
    step: int
    name: str
    """``step_000100.pt`` or ``step_000200.dcp`` (the name it has in a run directory)."""

    @property
    def format(self) -> Literal["pt", "dcp"]:
        return "pt" if self.name.endswith(".pt") else "dcp"

    @property
    def key(self) -> str:
        """The checkpoint's key (a ``.dcp`` one is a key prefix)."""
        return f"{self.run_id}/checkpoints/{self.name}"

    @property
    def commit_key(self) -> str:
        """The digest or manifest object: the checkpoint exists once this one does."""
        if self.format == "pt":
            return self.key + DIGEST_SUFFIX
        return f"{self.key}/{MANIFEST}"


def checkpoints_prefix(run_id: str) -> str:
    return f"{run_id}/checkpoints/"


def committed_checkpoints(bucket: Bucket, run_id: str) -> list[CheckpointRef]:
    """The run's committed checkpoints in the bucket, oldest first (one listing)."""
    prefix = checkpoints_prefix(run_id)
    found = {}
    for key in bucket.list(prefix):
        if m := _COMMIT.match(key[len(prefix) :]):
            name = m.group(1).removesuffix(DIGEST_SUFFIX).removesuffix("/" + MANIFEST)
            found[name] = CheckpointRef(run_id, int(m.group(2)), name)
    return sorted(found.values(), key=lambda ref: (ref.step, ref.name))


def newest_checkpoint(bucket: Bucket, run_id: str) -> CheckpointRef | None:
    """The newest committed checkpoint of ``run_id``; data without its commit is ignored."""
    refs = committed_checkpoints(bucket, run_id)
    return refs[-1] if refs else None


def local_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints in a run's ``checkpoints/`` directory, both formats, oldest
    first: a ``.pt`` with its digest beside it, a ``.dcp`` directory with its manifest."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        m = _PT.match(path.name) or _DCP.match(path.name)
        commit = (
            path.with_name(path.name + DIGEST_SUFFIX) if path.suffix == ".pt" else path / MANIFEST
        )
        if m and commit.is_file():
            found.append((int(m.group(1)), path))
    return sorted(found)


def commit_bytes(path: Path) -> bytes:
    """The local checkpoint's commit object: its digest file or its manifest."""
    if path.suffix == ".pt":
        return path.with_name(path.name + DIGEST_SUFFIX).read_bytes()
    return (path / MANIFEST).read_bytes()


def _manifest_files(manifest: bytes, where: str) -> dict[str, str]:
    try:
        files = json.loads(manifest)["files"]
        assert isinstance(files, dict)
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise CheckpointMismatch(f"{where}: unreadable {MANIFEST} ({exc})") from exc
    for name in files:
        if name.startswith("/") or ".." in Path(name).parts:
            raise CheckpointMismatch(f"{where}: {MANIFEST} names {name!r} outside the checkpoint")
    return {str(k): str(v) for k, v in files.items()}


def upload_checkpoint(bucket: Bucket, run_id: str, path: Path) -> bool:
    """Upload one committed local checkpoint, its commit object last. False when the bucket
    already holds it with the same digest. An earlier commit of the same step with other
    contents is withdrawn first, so a reader never pairs old digests with new data."""
    ref = CheckpointRef(run_id, int(path.name[5:].split(".")[0]), path.name)
    commit = commit_bytes(path)
    existing = bucket.get_bytes(ref.commit_key)
    if existing == commit:
        return False
    if existing is not None:
        bucket.delete(ref.commit_key)
    if ref.format == "pt":
        bucket.upload_file(path, ref.key)
    else:
        for name in sorted(_manifest_files(commit, str(path))):
            bucket.upload_file(path / name, f"{ref.key}/{name}")
    bucket.put_bytes(ref.commit_key, commit)
    return True


def delete_checkpoint(bucket: Bucket, ref: CheckpointRef) -> None:
    """Withdraw the commit object, then remove the data."""
    bucket.delete(ref.commit_key)
    delete_data(bucket, ref.run_id, ref.name)


def delete_data(bucket: Bucket, run_id: str, name: str) -> None:
    """Every key of checkpoint ``name`` (after its commit object is gone)."""
    key = f"{checkpoints_prefix(run_id)}{name}"
    if name.endswith(".pt"):
        bucket.delete(key)
        bucket.delete(key + DIGEST_SUFFIX)
    else:
        for sub in bucket.list(key + "/"):
            bucket.delete(sub)


def prune(bucket: Bucket, run_id: str, keep_last: int) -> list[str]:
    """Keep the newest ``keep_last`` committed checkpoints; remove older ones and any
    uncommitted data older than the newest commit (an upload cut short). Returns the
    names removed."""
    prefix = checkpoints_prefix(run_id)
    committed = committed_checkpoints(bucket, run_id)
    removed = []
    for ref in committed[:-keep_last]:
        delete_checkpoint(bucket, ref)
        removed.append(ref.name)
    if committed:
        newest = committed[-1].step
        names = {ref.name for ref in committed}
        orphans = {
            m.group(1)
            for key in bucket.list(prefix)
            if (m := _DATA.match(key[len(prefix) :]))
            and m.group(1) not in names
            and int(m.group(2)) < newest
        }
        for name in sorted(orphans):
            delete_data(bucket, run_id, name)
            removed.append(name)
    return removed


def fetch_checkpoint(bucket: Bucket, ref: CheckpointRef, dest: Path) -> Path:
    """Download ``ref`` into the checkpoints directory ``dest``, verified against its
    committed digest, and return its local path. Each file is written atomically and the
    commit (digest file, or the directory's rename) comes last, as ``ups.train`` writes
    checkpoints: a fetch cut short leaves nothing that resume would take."""
    dest.mkdir(parents=True, exist_ok=True)
    commit = bucket.get_bytes(ref.commit_key)
    if commit is None:
        raise BucketError(f"{bucket.url_of(ref.commit_key)} is gone: {ref.name} was pruned")
    final = dest / ref.name
    if ref.format == "pt":
        expected = commit.decode().strip()
        actual = bucket.download_file(ref.key, final)
        if actual != expected:
            final.unlink(missing_ok=True)
            raise CheckpointMismatch(
                f"{bucket.url_of(ref.key)}: SHA-256 {actual[:12]}… does not match its "
                f"committed digest {expected[:12]}… (modified in the bucket?)"
            )
        atomic_write_bytes(final.with_name(final.name + DIGEST_SUFFIX), commit)
        return final
    tmp = dest / f".{ref.name}.fetch-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, expected in sorted(_manifest_files(commit, bucket.url_of(ref.key)).items()):
            actual = bucket.download_file(f"{ref.key}/{name}", tmp / name)
            if actual != expected:
                raise CheckpointMismatch(
                    f"{bucket.url_of(ref.key)}/{name}: SHA-256 {actual[:12]}… does not match "
                    f"the manifest's {expected[:12]}…"
                )
        atomic_write_bytes(tmp / MANIFEST, commit)
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_dir(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


SCRIPT_LATEST = "script-latest.json"
"""``<run_id>/script-latest.json``: the newest checkpoint of a ``--script`` run in the
bucket, ``{"name", "sha256"}``, written after the checkpoint and its digest (a script's
names carry no step, so the pointer, not the names, says which one is newest)."""


def upload_script_checkpoint(bucket: Bucket, run_id: str, path: Path, digest: str) -> bool:
    """Upload a script's committed checkpoint file under the trainer's layout (data, then
    ``<name>.sha256``), then point ``script-latest.json`` at it. False when the pointer
    already names it with this digest."""
    pointer = json.dumps({"name": path.name, "sha256": digest}, sort_keys=True).encode()
    if bucket.get_bytes(f"{run_id}/{SCRIPT_LATEST}") == pointer:
        return False
    key = f"{checkpoints_prefix(run_id)}{path.name}"
    bucket.upload_file(path, key)
    bucket.put_bytes(key + DIGEST_SUFFIX, f"{digest}\n".encode())
    bucket.put_bytes(f"{run_id}/{SCRIPT_LATEST}", pointer)
    return True


def newest_script_checkpoint(bucket: Bucket, run_id: str) -> tuple[str, str] | None:
    """(name, sha256) of a script run's newest checkpoint in the bucket, or None."""
    raw = bucket.get_bytes(f"{run_id}/{SCRIPT_LATEST}")
    if raw is None:
        return None
    try:
        pointer = json.loads(raw)
        name, digest = str(pointer["name"]), str(pointer["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BucketError(
            f"{bucket.url_of(f'{run_id}/{SCRIPT_LATEST}')}: unreadable ({exc})"
        ) from None
    if "/" in name or name.startswith("."):
        raise BucketError(f"{bucket.url_of(f'{run_id}/{SCRIPT_LATEST}')} names {name!r}")
    return name, digest


def fetch_script_checkpoint(
    bucket: Bucket, run_id: str, name: str, digest: str, dest: Path
) -> Path:
    """Download checkpoint ``name`` into the script's checkpoint directory ``dest`` under a
    temporary name, check it against ``digest``, then rename it into place: by the
    contract's rename rule it is committed only once it is complete."""
    dest.mkdir(parents=True, exist_ok=True)
    staged = dest / f".{name}.fetch"
    actual = bucket.download_file(f"{checkpoints_prefix(run_id)}{name}", staged)
    if actual != digest:
        staged.unlink(missing_ok=True)
        raise CheckpointMismatch(
            f"{bucket.url_of(checkpoints_prefix(run_id) + name)}: SHA-256 {actual[:12]}… does "
            f"not match {digest[:12]}… recorded in {SCRIPT_LATEST} (modified in the bucket?)"
        )
    final = dest / name
    os.replace(staged, final)
    fsync_dir(dest)
    return final
