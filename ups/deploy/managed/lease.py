"""Never two supervisors act on one run: the one holding the run's lease does, others refuse,
and one that lost it stops.

The lease is ``runs/<id>/supervisor.lease``: who holds it (host, pid, the process's start
time, a random token), how (``following`` in a terminal or ``detached`` in the
background) and until when. It is taken inside an exclusive ``flock`` on
``runs/<id>/.supervisor.lock`` (read, decide, write, all while holding the lock), so two
supervisors starting at the same instant cannot both see it free; the lock itself is held
only for that moment, so a supervisor killed with SIGKILL leaves nothing locked. With a
bucket the lease is held in ``<run_id>/supervisor.lease`` there too, for supervisors on
other machines.

A holder on this machine is alive while its process is (pid and start time match) and not
stopped (SIGSTOP, Ctrl-Z) past its expiry: a ``kill -9``'d supervisor frees the run at
once, and one that slept with the laptop still holds it when the laptop wakes. A holder on
another machine (a lease read from the bucket) is believed until ``expires``; the holder
renews every third of its lifetime (:data:`TTL_S`). A second supervisor exits with
:data:`EXIT_SUPERVISED` naming the holder: it does not wait, because the holder may follow
the run for hours.

**Fenced.** Where the bucket's store honours conditional writes (asked once per
supervisor, :meth:`ups.bucket.Bucket.honours_conditions`), the bucket's lease is taken
with ``If-None-Match: *`` (or ``If-Match`` on the ETag of a dead holder's object), renewed
with ``If-Match`` on the ETag this holder wrote and released with a conditional delete. A
renewal that finds the lease someone else's (here or in the bucket) means it was taken
while this holder could not renew (a laptop that slept past the lease): the holder has
LOST the run. It says so in one line, sets :attr:`Lease.lost`, and every act that needs
the lease (a record write, a provider create or destroy) calls :meth:`Lease.check`, which
raises :class:`LeaseLost` (exit :data:`EXIT_LEASE_LOST`); a holder whose renewals are
overdue (it was stopped, or slept) renews inside :meth:`~Lease.check` first. Where the
store ignores conditions (``rclone serve s3``) the bucket's lease is written and read back
:data:`SETTLE_S` later instead, as a warning line says once, naming the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import psutil

from ups import jsonio
from ups.deploy.errors import DeployError, UsageError
from ups.fsio import atomic_write_text

if TYPE_CHECKING:
    from ups.bucket import Bucket

LEASE_FILE = "supervisor.lease"
LOCK_FILE = ".supervisor.lock"
TTL_S = 60.0
TTL_ENV = "UPS_LEASE_TTL_S"
"""Sets the lease's lifetime in seconds instead of :data:`TTL_S` (the tests shorten it)."""
SETTLE_S = 2.0
"""Between writing the bucket's lease and reading it back, where the store ignores
conditional writes: the last writer wins and a loser learns it here. Longer than one
read-then-write round trip of a rival, so two cannot both keep it."""
STOP_SIGNAL = signal.SIGUSR2
"""What the renewal thread of a lease taken with ``stop_main`` sends the main thread once
the lease is lost (SIGUSR1 is the trainer's stack dump)."""
DETACHING = "detaching"
"""The lease mode of a ``--detach`` deploy while it rents and starts the run: short-lived,
it hands the run to ``ups supervise`` (``following`` and ``detached`` supervise it)."""
EXIT_SUPERVISED = 20
"""Another live supervisor holds the run's lease; nothing was done."""
EXIT_LEASE_LOST = 21
"""This supervisor lost the run's lease to another (it could not renew it in time, e.g. the
laptop slept): it stopped acting; the run goes on under the new holder."""


class LeaseHeld(DeployError):
    exit_code = EXIT_SUPERVISED


class LeaseLost(SystemExit):
    """This supervisor lost the run's lease: it must stop acting at once. A SystemExit (code
    :data:`EXIT_LEASE_LOST`), so no ``except Exception`` on the way out can swallow it and
    carry on, and nothing on the way out may act on the run (end its instance, write its
    record): the run is the new holder's. The line was said when the loss was found."""

    def __init__(self, line: str) -> None:
        super().__init__(EXIT_LEASE_LOST)
        self.line = line

    def __str__(self) -> str:
        return self.line


def ttl_s() -> float:
    """The lease's lifetime: :data:`TTL_S`, or ``UPS_LEASE_TTL_S`` when set."""
    raw = os.environ.get(TTL_ENV, "")
    try:
        value = float(raw) if raw else TTL_S
    except ValueError:
        value = 0.0
    if value <= 0:
        raise UsageError(f"{TTL_ENV}={raw!r} is not a number of seconds > 0: unset it.")
    return value


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
    epoch: int = 0
    """The holder's lease epoch: one more than every holder's before it (the fence's
    label on every instance it creates)."""

    def alive(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if self.host == socket.gethostname():
            started, stopped = _process(self.pid)
            return started == self.pid_started and not (stopped and self.expires <= now)
        return self.expires > now

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        if self.mode == DETACHING:
            return (
                f"detached deploy pid {self.pid} on {self.host} (since {started}), which "
                "hands the run to a background supervisor (`ups supervise`, another pid) once "
                "the run has started"
            )
        return f"{self.mode} supervisor pid {self.pid} on {self.host} (since {started})"

    def how_to_end(self) -> str:
        """What ends this holder: a supervisor is killed (its instance ends per on_exit);
        a detaching deploy is waited for (its supervisor is the one to end afterwards)."""
        if self.mode == DETACHING:
            return (
                "or wait for that deploy to finish and end its supervisor then (`fab "
                "instances` names it)"
            )
        return (
            f"or end that supervisor first (`kill {self.pid}` on {self.host} ends its "
            "instance per on_exit)"
        )


def _process(pid: int) -> tuple[float | None, bool]:
    """When process ``pid`` started (None when it is gone: a zombie is gone, since a killed
    supervisor whose parent exited stays one until init reaps it), and whether it is
    stopped (SIGSTOP, Ctrl-Z)."""
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        if status == psutil.STATUS_ZOMBIE:
            return None, False
        return proc.create_time(), status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return None, False


def _parse(data: bytes | str) -> Holder | None:
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):
        return None  # a damaged lease protects nothing: it is free to take


def read(run_dir: Path) -> Holder | None:
    """The lease's holder as written (alive or not), or None."""
    try:
        return _parse((run_dir / LEASE_FILE).read_text())
    except FileNotFoundError:
        return None


def read_bucket(bucket: Bucket, run_id: str) -> Holder | None:
    """The bucket's lease holder as written (alive or not), or None."""
    data = bucket.get_bytes(f"{run_id}/{LEASE_FILE}")
    return None if data is None else _parse(data)


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class Lease:
    """This process's lease on one run; :meth:`take` it, then it renews itself until
    :meth:`release`. ``say`` gets the fallback warning and the line saying the lease was
    lost. With ``stop_main`` (taken in the main thread), the renewal thread that finds the
    lease lost raises :class:`LeaseLost` in the main thread too (by :data:`STOP_SIGNAL`),
    which may be blocked following a log for hours and touch no fence meanwhile."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        mode: str,
        bucket: Bucket | None = None,
        *,
        say: Callable[[str], None] = _stderr,
        stop_main: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.bucket = bucket
        """The run's bucket: the lease is held there too, for supervisors elsewhere."""
        self.run_id = run_id
        self.mode = mode
        self.say = say
        self.stop_main = stop_main
        self.ttl_s = ttl_s()
        self.token = secrets.token_hex(8)
        self.pid = os.getpid()
        self.lost = False
        """Set once another supervisor holds the run: nothing may act for it any more."""
        self.epoch = 0
        """This holder's epoch, set by :meth:`take`: newer than any holder's before it."""
        self._taker: Holder | None = None
        self._since = time.time()
        self._etag: str | None = None
        """The ETag of this holder's object in the bucket, when the store is fenced."""
        self._in_bucket = False
        """This holder is written in the bucket (not yet, after an outage at the take)."""
        self._confirmed = time.time()
        """When the last renewal that confirmed the lease started (wall clock: a sleep of
        the laptop counts)."""
        self._tried = self._confirmed
        """When the last renewal started, confirmed or not (a bucket outage)."""
        self._renewing = threading.Lock()
        self._raised = False
        self._handler: Callable[[int, FrameType | None], object] | int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _key(self) -> str:
        return f"{self.run_id}/{LEASE_FILE}"

    def _mine(self) -> Holder:
        return Holder(
            host=socket.gethostname(),
            pid=self.pid,
            pid_started=_process(self.pid)[0] or 0.0,
            token=self.token,
            mode=self.mode,
            since=self._since,
            expires=time.time() + self.ttl_s,
            epoch=self.epoch,
        )

    def _encoded(self) -> bytes:
        return jsonio.dumps(asdict(self._mine())).encode()

    def _write(self) -> None:
        atomic_write_text(self.run_dir / LEASE_FILE, jsonio.dumps(asdict(self._mine())) + "\n")

    def take(self, follow_hint: str, after_epoch: int = 0) -> None:
        """Hold the run or raise :class:`LeaseHeld` naming who does (``follow_hint``: the
        command that watches the run instead, as :func:`ups.deploy.frontend.command` writes).
        The epoch taken is one more than ``after_epoch`` (the run record's) and than any
        earlier holder's found here or in the bucket."""
        self.epoch = after_epoch + 1

        def refuse(held: Holder) -> LeaseHeld:
            return LeaseHeld(
                f"run {self.run_id} is already supervised by the {held.describe()}; "
                f"two supervisors would both recover it. Follow it with {follow_hint}, "
                f"{held.how_to_end()}."
            )

        with _locked(self.run_dir):
            held = read(self.run_dir)
            if held is not None and held.token != self.token and held.alive():
                raise refuse(held)
            if held is not None:
                self.epoch = max(self.epoch, held.epoch + 1)
            self._write()
        if self.bucket is not None:
            from ups.bucket import BucketError

            try:
                held = self._claim(self.bucket)
            except BucketError:
                held = None  # an outage: the local lease holds; renewals claim it later
            except BaseException:
                self.release()
                raise
            if held is not None:
                self.release()
                raise refuse(held)
        self._confirmed = self._tried = time.time()
        if self.stop_main:
            self._handler = signal.signal(STOP_SIGNAL, self._stop_main)
        self._thread = threading.Thread(target=self._renew_loop, daemon=True)
        self._thread.start()

    # -- the bucket's lease ---------------------------------------------------------------
    def _claim(self, bucket: Bucket) -> Holder | None:
        """Write this holder into the bucket unless a live other holds it (returned)."""
        # asked once per run: the answer stays with the bucket
        if bucket.conditions is None and not bucket.honours_conditions(self.run_id):
            self.say(
                f"warning: the bucket's store at {bucket.endpoint()} ignores conditional "
                "writes (a second If-None-Match: * write was not refused), so the "
                f"supervisor's lease in {bucket.url_of(self._key)} is not fenced: it is "
                f"written and read back {SETTLE_S:g} s later instead, and a write that a "
                "supervisor had in flight when it slept can still land after another took "
                "the run (AWS S3, Cloudflare R2 and MinIO honour conditional writes)"
            )
        return self._claim_fenced(bucket) if bucket.conditions else self._claim_read_back(bucket)

    def _claim_fenced(self, bucket: Bucket) -> Holder | None:
        from ups.bucket import PreconditionFailed

        held: Holder | None = None
        for _ in range(3):
            stored = bucket.get_stored(self._key)
            held = None if stored is None else _parse(stored.data)
            if held is not None and held.token == self.token and stored is not None:
                self._etag, self._in_bucket = stored.etag, True  # our write, its answer lost
                return None
            if held is not None and held.alive():
                return held
            if held is not None and held.epoch >= self.epoch:
                self.epoch = held.epoch + 1  # a dead holder elsewhere: newer than it
                self._write()
            try:
                if stored is None:
                    self._etag = bucket.put_if_absent(self._key, self._encoded())
                else:  # free to take, but only from the dead holder read just now
                    self._etag = bucket.put_if_match(self._key, self._encoded(), stored.etag)
            except PreconditionFailed:
                continue  # a rival wrote it between the read and the write: read again
            self._in_bucket = True
            return None
        return held  # three rivals in a row: as good as held

    def _claim_read_back(self, bucket: Bucket) -> Holder | None:
        held = read_bucket(bucket, self.run_id)
        if held is not None and held.token != self.token and held.epoch >= self.epoch:
            self.epoch = held.epoch + 1
        if held is None or held.token == self.token or not held.alive():
            bucket.put_bytes(self._key, self._encoded())
            time.sleep(SETTLE_S)  # a rival's write in flight lands before the read-back
            held = read_bucket(bucket, self.run_id)
        if held is not None and held.token != self.token:
            return held
        self._in_bucket = held is not None
        return None

    def _renew_bucket(self, bucket: Bucket) -> bool:
        """Renew the bucket's lease; False when that could not be confirmed (an outage)."""
        from ups.bucket import BucketError, PreconditionFailed

        try:
            if not self._in_bucket:
                if (held := self._claim(bucket)) is not None:
                    self._lose(held)
                return self._in_bucket
            if not bucket.conditions:
                asked = time.time()
                held = read_bucket(bucket, self.run_id)
                if held is None or held.token != self.token:
                    self._lose(held)
                    return False
                if time.time() - asked > self.ttl_s / 3:
                    return False  # stopped mid-read: what it read is stale; read again
                bucket.put_bytes(self._key, self._encoded())
                return True
            assert self._etag is not None  # a fenced holder in the bucket knows its ETag
            try:
                self._etag = bucket.put_if_match(self._key, self._encoded(), self._etag)
            except PreconditionFailed:
                stored = bucket.get_stored(self._key)
                held = None if stored is None else _parse(stored.data)
                if stored is None or held is None or held.token != self.token:
                    self._lose(held)
                    return False
                self._etag = stored.etag  # our own write, retried after its answer was lost
            return True
        except BucketError:
            return False  # an outage: the next renewal tries again; the local lease holds

    # -- renewal and the fence ------------------------------------------------------------
    def _renew_local(self) -> None:
        with _locked(self.run_dir):
            held = read(self.run_dir)
            if held is not None and held.token == self.token:
                self._write()
                return
        self._lose(held)  # taken (this process was stopped past its lease), or released

    def renew(self, unless_tried_since: float | None = None) -> None:
        """Renew here and in the bucket now (unless a renewal started after
        ``unless_tried_since``); a lease found to be someone else's is lost."""
        with self._renewing:  # a renewal in flight finishes first
            if self.lost or (unless_tried_since is not None and self._tried > unless_tried_since):
                return
            started = self._tried = time.time()
            self._renew_local()
            if self.lost:
                return
            if self.bucket is None or self._renew_bucket(self.bucket):
                self._confirmed = started

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew()
            if self.lost:
                if self.stop_main and not self._raised:
                    ident = threading.main_thread().ident
                    assert ident is not None  # the main thread took the lease
                    signal.pthread_kill(ident, STOP_SIGNAL)
                return

    def _stop_main(self, signum: int, frame: FrameType | None) -> None:
        if self.lost and not self._raised:
            self._raised = True
            raise LeaseLost(self._line())

    def _lose(self, taker: Holder | None) -> None:
        self.lost, self._taker = True, taker
        self.say(self._line())

    def _line(self) -> str:
        who = (
            f"the {self._taker.describe()}" if self._taker else "a supervisor that since let it go"
        )
        return (
            f"supervisor pid {self.pid} lost the lease of run {self.run_id} to {who}: it stops "
            "acting now; the run goes on under the new holder"
        )

    def check(self) -> None:
        """The fence: raise :class:`LeaseLost` unless this process still holds the run.
        Called before every act that needs the lease; cheap unless renewals are overdue
        (the process was stopped or the machine slept), when it renews first."""
        now = time.time()
        if not self.lost and now - self._confirmed > self.ttl_s / 2:
            self.renew(unless_tried_since=now - self.ttl_s / 3)  # not again in an outage
        if self.lost:
            self._raised = True
            raise LeaseLost(self._line())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._handler is not None:
            signal.signal(STOP_SIGNAL, self._handler)
            self._handler = None
        with _locked(self.run_dir):
            held = read(self.run_dir)
            if held is not None and held.token == self.token:
                (self.run_dir / LEASE_FILE).unlink(missing_ok=True)
        if self.bucket is not None and self._in_bucket and not self.lost:
            self._release_bucket(self.bucket)

    def _release_bucket(self, bucket: Bucket) -> None:
        from ups.bucket import BucketError

        try:
            if bucket.conditions and self._etag is not None:
                bucket.delete_if_match(self._key, self._etag)
                return
            held = read_bucket(bucket, self.run_id)
            if held is not None and held.token == self.token:
                bucket.delete(self._key)
        except BucketError:
            pass  # someone else's now, or an outage: it expires by itself within its TTL

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(run_dir: Path) -> Holder | None:
    """The live holder of the run's lease, or None (no supervisor acts on it now)."""
    held = read(run_dir)
    return held if held is not None and held.alive() else None
