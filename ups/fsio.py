"""The one way ups writes a file that must never be seen half-written.

Checkpoints, outcomes, cache manifests, host keys, torchrun results, the demo data's HDF5
files and the ``latest`` run link all go through here: write a temporary file in the same
directory, fsync it, rename it over the target, fsync the directory. On any error
(ENOSPC, EIO, a signal's exception) the temporary file is removed, so a failed write never
leaves a file that keeps a full disk full, and the old target stays as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: Path, mode: int = 0o644, *, readable: bool = False) -> Iterator[IO[bytes]]:
    """Yield a binary file whose contents replace ``path`` atomically when the block ends.

    ``mode`` is applied at creation (0o600 for secrets: never briefly world-readable).
    ``readable``: open it for reading too, for writers that read back what they wrote
    (h5py, given a file object, writes an HDF5 file through it).
    """
    tmp = _tmp_name(path)
    flags = (os.O_RDWR if readable else os.O_WRONLY) | os.O_CREAT | os.O_TRUNC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "w+b" if readable else "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes | memoryview, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a mix."""
    with atomic_open(path, mode) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Text form of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_symlink(link: Path, target: Path | str) -> None:
    """Point ``link`` at ``target``, replacing an existing link in one rename."""
    tmp = _tmp_name(link)
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(link.parent)
