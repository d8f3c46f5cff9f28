"""Never two supervisors act on one run: the one holding the run's lease does, others refuse.

The lease is ``runs/<id>/supervisor.lease``: who holds it (host, pid, the process's start
time, a random token), how (``following`` in a terminal or ``detached`` in the
background) and until when. It is taken inside an exclusive ``flock`` on
``runs/<id>/.supervisor.lock`` (read, decide, write, all while holding the lock), so two
supervisors starting at the same instant cannot both see it free; the lock itself is held
only for that moment, so a supervisor killed with SIGKILL leaves nothing locked.

A holder on this machine is alive exactly while its process is (pid and start time match):
a ``kill -9``'d supervisor frees the run at once, and one that slept with the laptop still
holds it when the laptop wakes, expired or not. A holder on another machine (a lease read
from the run's bucket) is believed until ``expires``; the holder renews every
``TTL_S / 3``. A second supervisor exits with :data:`EXIT_SUPERVISED` naming the holder:
it does not wait, because the holder may follow the run for hours and the person at the
terminal should learn that now, with the command that follows the run instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ups import jsonio
from ups.deploy.errors import DeployError
from ups.fsio import atomic_write_text

if TYPE_CHECKING:
    from ups.bucket import Bucket

LEASE_FILE = "supervisor.lease"
LOCK_FILE = ".supervisor.lock"
TTL_S = 60.0
EXIT_SUPERVISED = 20
"""Another live supervisor holds the run's lease; nothing was done."""


class LeaseHeld(DeployError):
    exit_code = EXIT_SUPERVISED


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    pid_started: float
    token: str
    mode: str
    """``following`` (a deploy in a terminal) or ``detached`` (``ups supervise``)."""
    since: float
    expires: float

    def alive(self, now: float | None = None) -> bool:
        if self.host == socket.gethostname():
            return _process_started(self.pid) == self.pid_started
        return self.expires > (time.time() if now is None else now)

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        return f"{self.mode} supervisor pid {self.pid} on {self.host} (since {started})"


def _process_started(pid: int) -> float | None:
    """When process ``pid`` started, or None when it is gone (a zombie is gone: a killed
    supervisor whose parent exited stays one until init reaps it)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.Error:
        return None


def read(run_dir: Path) -> Holder | None:
    """The lease's holder as written (alive or not), or None."""
    try:
        return Holder(**json.loads((run_dir / LEASE_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        return None  # a damaged lease protects nothing: it is free to take


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


class Lease:
    """This process's lease on one run; :meth:`take` it, then it renews itself until
    :meth:`release`."""

    def __init__(self, run_dir: Path, run_id: str, mode: str, bucket: Bucket | None = None) -> None:
        self.run_dir = run_dir
        self.bucket = bucket
        """The run's bucket: the lease is held there too, for supervisors elsewhere."""
        self.run_id = run_id
        self.mode = mode
        self.token = secrets.token_hex(8)
        self.pid = os.getpid()
        self._since = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _mine(self) -> Holder:
        return Holder(
            host=socket.gethostname(),
            pid=self.pid,
            pid_started=_process_started(self.pid) or 0.0,
            token=self.token,
            mode=self.mode,
            since=self._since,
            expires=time.time() + TTL_S,
        )

    def _write(self) -> None:
        atomic_write_text(self.run_dir / LEASE_FILE, jsonio.dumps(asdict(self._mine())) + "\n")

    def take(self, follow_hint: str) -> None:
        """Hold the run or raise :class:`LeaseHeld` naming who does (``follow_hint`` is
        the command that watches the run instead)."""

        def refuse(held: Holder) -> LeaseHeld:
            return LeaseHeld(
                f"run {self.run_id} is already supervised by the {held.describe()}; "
                f"two supervisors would both recover it. Follow it with `{follow_hint}`, "
                f"or end that supervisor first (`kill {held.pid}` on {held.host} ends its "
                "instance per on_exit)."
            )

        with _locked(self.run_dir):
            held = read(self.run_dir)
            if held is not None and held.token != self.token and held.alive():
                raise refuse(held)
            self._write()
        if self.bucket is not None:
            from ups.deploy.managed import store as bucket_state

            try:
                bucket_state.take_lease(self.bucket, self.run_id, self._mine(), refuse)
            except BaseException:
                self.release()
                raise
        self._thread = threading.Thread(target=self._renew, daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(TTL_S / 3):
            with _locked(self.run_dir):
                held = read(self.run_dir)
                if held is None or held.token == self.token:
                    self._write()
            if self.bucket is not None:
                from ups.deploy.managed import store as bucket_state

                bucket_state.renew_lease(self.bucket, self.run_id, self._mine())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with _locked(self.run_dir):
            held = read(self.run_dir)
            if held is not None and held.token == self.token:
                (self.run_dir / LEASE_FILE).unlink(missing_ok=True)
        if self.bucket is not None:
            from ups.deploy.managed import store as bucket_state

            bucket_state.release_lease(self.bucket, self.run_id, self.token)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(run_dir: Path) -> Holder | None:
    """The live holder of the run's lease, or None (no supervisor acts on it now)."""
    held = read(run_dir)
    return held if held is not None and held.alive() else None
