"""Ship an image to a remote Docker daemon, sending only the layers it lacks.

The local daemon saves the image (Docker SDK); the remote daemon's images give the layer
chains it already has; the tar that goes over SSH holds the manifest, the image config
and only the missing ``layer.tar`` files, gzip-compressed on the fly into the remote's
``docker load``. The daemon skips a layer whose chain it already has without opening its
file (moby ``image/tarexport/load.go``), so a code-only change moves one small layer.
"""

from __future__ import annotations

import hashlib
import json
import queue
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ups.deploy.errors import DeployError


def chain_ids(diff_ids: list[str]) -> list[str]:
    """OCI ChainIDs: chain(0) = diff(0); chain(n) = sha256(chain(n-1) + " " + diff(n))."""
    chains: list[str] = []
    for diff in diff_ids:
        if not chains:
            chains.append(diff)
        else:
            digest = hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest()
            chains.append(f"sha256:{digest}")
    return chains


def remote_chains(client: Any) -> set[str]:
    """Every layer chain the remote daemon holds (from all its images' RootFS)."""
    have: set[str] = set()
    for image in client.images.list(all=True):
        have.update(chain_ids(image.attrs.get("RootFS", {}).get("Layers", [])))
    return have


@dataclass
class TransferPlan:
    image: str
    image_id: str
    layers: int
    missing: list[int]
    """Indices (0-based) of the layers the remote lacks."""
    up_to_date: bool
    """The remote already has this exact image id."""
    missing_bytes: int = 0
    """Uncompressed size of the missing layers (known after the local save)."""

    def describe(self) -> str:
        if self.up_to_date:
            return f"{self.image}: remote already has {self.image_id[:19]}"
        return (
            f"{self.image}: send {len(self.missing)} of {self.layers} layers "
            f"(remote has the first {self.layers - len(self.missing)})"
        )


def plan_transfer(local: Any, remote: Any, image: str) -> TransferPlan:
    try:
        img = local.images.get(image)
    except Exception as err:  # docker.errors.ImageNotFound / APIError
        raise DeployError(
            f"image {image!r} is not in the local Docker engine ({err}). Build it first "
            "(scripts/build-images.sh) or fix 'image' in hosts.yaml."
        ) from None
    diff_ids: list[str] = img.attrs["RootFS"]["Layers"]
    have = remote_chains(remote)
    missing = [i for i, chain in enumerate(chain_ids(diff_ids)) if chain not in have]
    remote_ids = {i.id for i in remote.images.list(all=True)}
    return TransferPlan(
        image=image,
        image_id=img.id,
        layers=len(diff_ids),
        missing=missing,
        up_to_date=img.id in remote_ids,
    )


def save_local(local: Any, image: str, spool: Path) -> Path:
    """``docker save`` the image into a local file (random access for the manifest)."""
    path = spool / "image.tar"
    with path.open("wb") as fh:
        for chunk in local.images.get(image).save(chunk_size=4 << 20, named=True):
            fh.write(chunk)
    return path


def _partial_tar(saved: Path, missing: set[int], sink: IO[bytes]) -> int:
    """Copy ``saved`` into ``sink`` without the layer files the remote has; return their size."""
    missing_bytes = 0
    with tarfile.open(saved) as src:
        manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]  # extractfile is Optional; docker save always writes it
        layer_files = manifest[0]["Layers"]
        skip = {name for i, name in enumerate(layer_files) if i not in missing}
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:
            for member in src:
                if member.name in skip:
                    continue
                if member.name in layer_files:
                    missing_bytes += member.size
                data = src.extractfile(member) if member.isfile() else None
                out.addfile(member, data)
    return missing_bytes


class _GzipQueue:
    """A write-only file that gzips into a bounded queue the uploader iterates."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self.z = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip container, fast level

    def write(self, data: bytes) -> int:
        out = self.z.compress(data)
        if out:
            self.q.put(out)
        return len(data)

    def close(self) -> None:
        self.q.put(self.z.flush())
        self.q.put(None)


def send_image(
    remote: Any,
    saved: Path,
    plan: TransferPlan,
    on_bytes: Callable[[int], None],
) -> int:
    """Stream the partial, gzipped tar into the remote ``docker load``; return bytes sent."""
    gz = _GzipQueue()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            plan.missing_bytes = _partial_tar(saved, set(plan.missing), gz)  # type: ignore[arg-type]  # _GzipQueue has the write() tarfile uses
        except BaseException as err:  # handed to the consumer thread below
            errors.append(err)
        finally:
            gz.close()

    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        while (chunk := gz.q.get()) is not None:
            sent += len(chunk)
            on_bytes(len(chunk))
            yield chunk

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        for line in remote.api.load_image(body()):
            if "error" in line:
                raise DeployError(f"remote docker load failed: {line['error']}")
    finally:
        producer.join(timeout=60)
    if errors:
        raise DeployError(f"building the image tar failed: {errors[0]}")
    return sent


def transfer(
    local: Any, remote: Any, image: str, on_bytes: Callable[[int], None]
) -> tuple[TransferPlan, int]:
    """Make ``image`` exist on the remote daemon; return the plan and bytes sent."""
    plan = plan_transfer(local, remote, image)
    if plan.up_to_date:
        return plan, 0
    with tempfile.TemporaryDirectory(prefix="ups-image-") as spool:
        saved = save_local(local, image, Path(spool))
        sent = send_image(remote, saved, plan, on_bytes)
    if remote.images.get(image).id != plan.image_id:
        raise DeployError(f"after the transfer the remote {image!r} has a different id")
    return plan, sent
