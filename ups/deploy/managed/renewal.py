"""The supervisor keeps a rented host's bucket credentials alive while it follows the run.

Credentials minted for the run (:mod:`ups.bucket.scoped`) expire; while the run needs
them past that, a thread here mints new ones from this machine's keys before they do
(``checkpoint_sync.renew_before_s``, default half their lifetime) and replaces the host's
0600 file whole over SSH. The uploader on the host reads the file again as its
credentials near their expiry (:func:`ups.bucket.credentials.file_session`), so no
process there restarts. A renewal that fails is said and tried again; should the
credentials lapse meanwhile, the host keeps training and says so
(``checkpoint_sync_failed``, ``cause: credentials_expired``), and its uploads catch up once
the file is renewed. A supervisor that picks up a running instance learns the expiry
from the file there.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import paramiko
from fabric import Connection

from ups.bucket.credentials import FILE_NAME as CREDENTIALS_FILE
from ups.bucket.credentials import NoCredentials, iso, parse_file
from ups.bucket.scoped import Access, MintRefused, keys_for
from ups.deploy.errors import DeployError
from ups.deploy.onhost.plan import DeployPlan
from ups.deploy.transport.session import Target, replace_private

_ERRORS = (DeployError, OSError, EOFError, paramiko.SSHException)


@dataclass
class Renewal:
    """Renews the credentials file ``path`` on ``target`` for ``access``."""

    target: Target
    path: str
    access: Access
    say: Callable[[str], None]
    expires: float | None = None
    """When the host's credentials expire (epoch); None until read from the host."""
    renewed: list[float] = field(default_factory=list)
    """Seconds each renewal took (mint and write)."""
    _conn: Connection | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def check_every_s(self, now: float) -> float:
        """Often enough to renew well inside the window, at most once a minute."""
        before = self.access.renew_before_s or self.access.lifetime_s(now) / 2
        return min(60.0, max(1.0, (self.access.lifetime_s(now) - before) / 3))

    def once(self, now: float | None = None) -> bool:
        """Renew when due; whether it did."""
        now = time.time() if now is None else now
        if self.access.mode != "scoped":
            return False
        if self.expires is None:
            self.expires = self._host_expiry()
            if self.expires is None:
                return False
        if not self.access.renew_due(self.expires, now):
            return False
        started = time.monotonic()
        keys = keys_for(self.access, now)
        replace_private(self._connection(), self.path, keys.file_text())
        self.expires = keys.expires
        self.renewed.append(time.monotonic() - started)
        assert keys.expires is not None  # minted keys expire
        self.say(
            f"renewed the instance's bucket credentials (scoped to {self.access.prefix_url}) "
            f"in {self.renewed[-1]:.2f} s: valid until {iso(keys.expires)}"
        )
        return True

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.target.connect()
        return self._conn

    def _host_expiry(self) -> float | None:
        """The expiry in the host's file; None without one (no file, or account keys)."""
        try:
            with self._connection().sftp().open(self.path, "r") as fh:
                text = fh.read().decode()
        except FileNotFoundError:
            return None
        try:
            return parse_file(text, self.path).expires
        except NoCredentials:
            return None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="renewal", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.check_every_s(time.time())):
            try:
                self.once()
            except (MintRefused, NoCredentials) as err:
                left = f"{self.expires - time.time():.0f} s" if self.expires else "unknown"
                self.say(
                    f"warning: could not renew the instance's bucket credentials ({left} left "
                    f"of them): {err}"
                )
            except _ERRORS:
                self.close()  # a dropped connection: the next round reconnects

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def renewal_for(target: Target, plan: DeployPlan, say: Callable[[str], None]) -> Renewal | None:
    """A started renewal of ``plan``'s scoped credentials on ``target``; None when the host
    has none to renew."""
    access = plan.bucket_access
    if access is None or access.mode != "scoped":
        return None
    renewal = Renewal(target, plan.remote.state(CREDENTIALS_FILE), access, say)
    renewal.start()
    return renewal
