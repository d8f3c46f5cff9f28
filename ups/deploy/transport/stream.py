"""Follow a remote log by byte offset over raw SSH channels, losing and repeating nothing.

The remote side is ``tail -c +N -F LOG`` on an exec channel (never captured ``run()``
output, which grows without bound). The local offset advances only past complete lines,
so after a dropped connection the follower reconnects with backoff and asks for byte
``offset + 1`` again: a half-received line is re-read whole, a received line never twice.
A watcher loop beside ``tail`` ends the channel with exit status 0 once one of the
``done`` files exists (the run's outcome.json); a final non-following read then picks up
whatever ``tail`` had not yet sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import paramiko

from ups.backoff import LOG_STREAM
from ups.deploy.errors import DeployError
from ups.deploy.frontend import command
from ups.deploy.transport.remote import catch_up_command, follow_command
from ups.log import get_logger

HEARTBEAT_S = 2.0
"""The remote watcher writes one byte to stderr this often, so a silent dead link shows."""

_DROPS = (paramiko.SSHException, OSError, EOFError, socket.timeout)


STOP_REQUESTED = threading.Event()
"""Set by the deploy's stop-signal handler (``ups.deploy.managed.lifecycle.signals_interrupt``)
as it raises KeyboardInterrupt. A library that was waiting on its own when the signal came
may swallow that exception; the follower raises it again at its next poll (0.2 s), so a
Ctrl-C is never lost. (Seen under load: a deploy went on following for minutes after a
Ctrl-C, in the tests that press it mid-run.)"""


def raise_if_stop_requested() -> None:
    if STOP_REQUESTED.is_set():
        raise KeyboardInterrupt


class ConnectionDropped(Exception):
    """The channel ended without the remote side saying it was done."""


@dataclass
class FollowStats:
    offset: int = 0
    """Bytes of the remote file delivered as complete lines."""
    lines: int = 0
    reconnects: int = 0
    drops: list[float] = field(default_factory=list)
    """Time of each detected drop (monotonic)."""


class LogFollower:
    """Stream ``path`` on the remote host to ``on_line`` until a ``done`` file appears.

    ``open_transport`` returns a connected transport (a fresh one after a drop).
    ``on_line`` gets every line with its trailing newline, exactly as stored remotely.
    """

    def __init__(
        self,
        open_transport: Callable[[], paramiko.Transport],
        path: str,
        done: Sequence[str],
        on_line: Callable[[bytes], None],
        *,
        offset: int = 0,
        heartbeat_s: float = HEARTBEAT_S,
        max_backoff_s: float = LOG_STREAM.max_s,
        give_up_after_s: float = 600.0,
    ) -> None:
        self.open_transport = open_transport
        self.path = path
        self.done = list(done)
        self.on_line = on_line
        self.stats = FollowStats(offset=offset)
        self.heartbeat_s = heartbeat_s
        self.max_backoff_s = max_backoff_s
        self.give_up_after_s = give_up_after_s
        self._transport: paramiko.Transport | None = None
        self._log = get_logger("ups.deploy.transport.stream")

    def follow(self) -> FollowStats:
        """Block until the run is done and every byte of the log was delivered."""
        down_since: float | None = None
        policy = LOG_STREAM.with_(max_s=self.max_backoff_s)
        delays = policy.delays()
        while True:
            try:
                transport = self._connected()
                if down_since is not None:
                    self.stats.reconnects += 1
                    self._log.info(
                        "log_stream_reconnected",
                        offset=self.stats.offset,
                        reconnects=self.stats.reconnects,
                    )
                    down_since, delays = None, policy.delays()
                self._stream(
                    transport,
                    follow_command(self.path, self.stats.offset, self.done, self.heartbeat_s),
                )
                self._stream(transport, catch_up_command(self.path, self.stats.offset), final=True)
                return self.stats
            except (ConnectionDropped, *_DROPS) as err:
                self._drop()
                now = time.monotonic()
                self.stats.drops.append(now)
                down_since = down_since if down_since is not None else now
                if now - down_since > self.give_up_after_s:
                    raise DeployError(
                        f"lost the connection for {self.give_up_after_s:.0f} s while following "
                        f"{self.path} (last error: {err}). The run keeps going remotely; "
                        f"re-attach with {command('logs', '--host HOST --run RUN')}."
                    ) from None
                backoff = next(delays)
                self._log.warning(
                    "log_stream_dropped",
                    error=str(err) or type(err).__name__,
                    offset=self.stats.offset,
                    retry_in_s=backoff,
                )
                time.sleep(backoff)

    def close(self) -> None:
        self._drop()

    def _connected(self) -> paramiko.Transport:
        if self._transport is None or not self._transport.is_active():
            self._drop()
            self._transport = self.open_transport()
        return self._transport

    def _drop(self) -> None:
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.close()
            self._transport = None

    def _stream(self, transport: paramiko.Transport, command: str, final: bool = False) -> None:
        chan = transport.open_session()
        try:
            chan.settimeout(0.2)
            chan.exec_command(command)
            pending = b""
            last_heard = time.monotonic()
            while True:
                try:
                    chunk = chan.recv(65536)
                except TimeoutError:
                    chunk = None
                raise_if_stop_requested()
                while chan.recv_stderr_ready():
                    chan.recv_stderr(4096)
                    last_heard = time.monotonic()
                if chunk == b"":
                    chan.recv_exit_status()  # EOF can come before the exit status
                    break
                if chunk:
                    last_heard = time.monotonic()
                    pending = self._deliver(pending + chunk)
                elif time.monotonic() - last_heard > 3 * self.heartbeat_s + 1:
                    raise ConnectionDropped(f"no heartbeat for {3 * self.heartbeat_s:.0f} s")
                if not transport.is_active():
                    raise ConnectionDropped("transport closed")
            if not chan.exit_status_ready() or chan.exit_status != 0:
                raise ConnectionDropped("channel closed before the remote side finished")
            if final and pending:
                # The file is complete: its last line has no newline, deliver it as is.
                self.stats.offset += len(pending)
                self.stats.lines += 1
                self.on_line(pending)
        finally:
            chan.close()

    def _deliver(self, data: bytes) -> bytes:
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            return data
        for line in data[: cut - 1].split(b"\n"):
            self.on_line(line + b"\n")
            self.stats.lines += 1
        self.stats.offset += cut
        return data[cut:]
