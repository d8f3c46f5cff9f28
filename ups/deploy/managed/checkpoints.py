"""Checkpoints leave the instance as they are written, so a lost instance loses little.

Each ``step_N.pt`` on the instance whose ``.sha256`` exists (the trainer writes the digest
after the checkpoint, both atomically: the pair means complete) is copied into the local
run directory over SFTP on the deploy's verified SSH connection. A copy that a dropped
connection interrupted resumes from its ``.part`` file; the whole file is checked against
the digest before it is renamed into place, digest first, so no checkpoint here is ever
without its digest. Checkpoints the trainer pruned on the instance stay here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection

from ups.deploy.errors import DeployError
from ups.deploy.transport.progress import human_bytes
from ups.deploy.transport.session import Target
from ups.fsio import atomic_write_text

_NAME = re.compile(r"step_(\d+)\.pt$")
_CHUNK = 1 << 20
_ERRORS = (DeployError, OSError, EOFError, paramiko.SSHException)


@dataclass(frozen=True)
class Synced:
    """One checkpoint copied home."""

    step: int
    size: int
    sent: int
    """Bytes sent this time (less than ``size`` when an interrupted copy resumed)."""
    seconds: float
    lag_s: float
    """From the checkpoint being written on the instance to it being verified here."""
    behind: int
    """Newer complete checkpoints on the instance still to copy after this one."""


def newest_good(local_dir: Path) -> tuple[int, Path] | None:
    """The newest checkpoint here that matches its digest (what a recovery uploads)."""
    # Loading a checkpoint needs torch; only a recovery gets here, so `fab status`,
    # `fab --list` and the rest of deploy never pay for importing it.
    from ups.train.checkpoint import CheckpointCorrupt, load_checkpoint

    for step, path in reversed(_local_checkpoints(local_dir)):
        if not path.with_name(path.name + ".sha256").exists():
            continue
        try:
            load_checkpoint(path)
        except CheckpointCorrupt:
            continue
        return step, path
    return None


def _local_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``step_N.pt`` files in ``directory``, oldest step first (the trainer's naming)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class CheckpointSync:
    """Copies new checkpoints from ``remote_dir`` on ``target`` into ``local_dir``."""

    target: Target
    remote_dir: str
    local_dir: Path
    say: Callable[[str], None]
    then: Callable[[Synced], None] | None = None
    """Called with each checkpoint once it is verified here (the supervision state)."""
    synced: list[Synced] = field(default_factory=list)
    _conn: Connection | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def have(self) -> set[int]:
        return {
            step
            for step, path in _local_checkpoints(self.local_dir)
            if path.with_name(path.name + ".sha256").exists()
        }

    def once(self) -> list[Synced]:
        """Copy every complete checkpoint not here yet, oldest first."""
        if self._conn is None:
            self._conn = self.target.connect()
        sftp = self._conn.sftp()
        try:
            entries = {e.filename: e for e in sftp.listdir_attr(self.remote_dir)}
        except FileNotFoundError:
            return []  # no checkpoint written yet
        have = self.have()
        todo = sorted(
            (int(m.group(1)), entry)
            for name, entry in entries.items()
            if (m := _NAME.match(name)) and f"{name}.sha256" in entries
        )
        todo = [(step, entry) for step, entry in todo if step not in have]
        done = []
        for i, (step, entry) in enumerate(todo):
            done.append(self._copy(sftp, step, entry, behind=len(todo) - i - 1))
        return done

    def _copy(self, sftp: paramiko.SFTPClient, step: int, entry: Any, behind: int) -> Synced:
        name = entry.filename
        remote = posixpath.join(self.remote_dir, name)
        with sftp.open(remote + ".sha256", "r") as fh:
            digest = fh.read().decode().strip()
        self.local_dir.mkdir(parents=True, exist_ok=True)
        part = self.local_dir / f"{name}.part"
        size = int(entry.st_size or 0)
        start = part.stat().st_size if part.exists() else 0
        if start > size:
            part.unlink()
            start = 0
        t0 = time.monotonic()
        with sftp.open(remote, "rb") as src, part.open("ab") as dst:
            src.seek(start)
            src.prefetch(size)  # pipelined reads from the seek position on
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if _digest(part) != digest:
            part.unlink()
            raise DeployError(
                f"checkpoint {name} copied from the instance does not match its SHA-256; "
                "it will be copied again"
            )
        final = self.local_dir / name
        atomic_write_text(final.with_name(name + ".sha256"), digest + "\n")
        os.replace(part, final)
        got = Synced(
            step=step,
            size=size,
            sent=size - start,
            seconds=time.monotonic() - t0,
            lag_s=max(0.0, time.time() - float(entry.st_mtime or time.time())),
            behind=behind,
        )
        self.synced.append(got)
        if self.then is not None:
            self.then(got)
        resumed = f", resumed at {human_bytes(start)}" if start else ""
        self.say(
            f"synced checkpoint step {step}: {human_bytes(got.sent)} in {got.seconds:.2f} s"
            f"{resumed}, {got.lag_s:.1f} s after it was written; {behind} newer to copy"
        )
        return got

    def start(self, every_s: float) -> None:
        """Sync every ``every_s`` seconds in a thread until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.once()
            except _ERRORS:
                self.close()  # a dropped connection: the next round reconnects and resumes

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
            self._thread = None

    def top_up(self) -> None:
        """The final round after the run ended: whatever the thread had not copied yet."""
        try:
            self.once()
        finally:
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
