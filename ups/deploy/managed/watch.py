"""What a followed managed run is watched by: :class:`Monitor` asks the API about the
instance every ``monitor_s`` and reports it lost (outbid, stopped, no longer listed, or
SSH unreachable for ``ssh_lost_s``), cutting the log stream short; :class:`LocalLog`
keeps the local copy of ``launch.log`` that a recovery uploads; :class:`Leg` and
:class:`Pending` say which instance is worked on and what a recovery under way resumes.
The loop that uses them is :mod:`ups.deploy.managed.controller`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import paramiko
from fabric import Connection

from ups import jsonio
from ups.deploy.errors import DeployError
from ups.deploy.providers import InstanceState as State
from ups.deploy.providers import Provider, ProviderApiError
from ups.deploy.transport.session import Target
from ups.fsio import atomic_write_bytes

RECOVERY_EVENT = "run_recovery"
"""The ``event`` of the one marked line each recovery adds to the run's launch.log."""
LOST = {
    State.OUTBID: "outbid (the provider took it back)",
    State.GONE: "vanished from the provider's API",
    State.STOPPED: "stopped outside ups",
    State.FAILED: "failed on its host",
}
_SSH_ERRORS = (DeployError, OSError, EOFError, paramiko.SSHException)


class InstanceLost(Exception):
    def __init__(self, instance_id: str, reason: str) -> None:
        super().__init__(f"instance {instance_id} lost: {reason}")
        self.instance_id = instance_id
        self.reason = reason


class Monitor:
    """Asks the API about one instance; once it is lost, cuts the log stream short."""

    def __init__(self, provider: Provider, instance_id: str, every_s: float) -> None:
        self.provider = provider
        self.instance_id = instance_id
        self.every_s = every_s
        self.lost: str | None = None
        self.state: State | None = None
        self.detected: float | None = None
        self._conns: list[Connection] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def check(self) -> str | None:
        """One API call: why the instance is lost, or None while it is running."""
        if self.lost is None:
            try:
                inst = self.provider.get(self.instance_id)
            except ProviderApiError:
                return None  # an API outage says nothing about the instance
            state = inst.state if inst is not None else State.GONE
            reason = LOST.get(state)
            if reason is not None:
                self.lost, self.state, self.detected = reason, state, time.monotonic()
                for conn in self._conns:  # the follower sees a drop, reconnects, hears why
                    with contextlib.suppress(Exception):
                        conn.close()
        return self.lost

    def connect(self, target: Target) -> Connection:
        """``target.connect`` for the log follower; raises :class:`InstanceLost` once lost."""
        if self._conns:
            self.check()  # a reconnect: ask the API first, not after SSH retries time out
        if self.lost is None:
            try:
                conn = target.connect()
            except DeployError as err:
                if self.check() is None:
                    raise OSError(f"SSH to the instance failed: {err}") from None  # retried
            else:
                self._conns.append(conn)
                return conn
        raise InstanceLost(self.instance_id, self.lost or "unknown")

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s) and self.check() is None:
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=180)


def _event(line: bytes) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class LocalLog:
    """The run's launch.log here: the remote log's bytes plus one marked line per recovery.

    Lines of steps after the checkpoint a recovery resumes from are moved to
    ``logs/lost-<instance>.log``: the resumed run logs those steps again, once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] | None = None

    def reset(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, b"")

    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def write(self, line: bytes) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("ab")
        self._fh.write(line)
        self._fh.flush()

    def mark(self, **fields: Any) -> bytes:
        line = (
            jsonio.dumps({"event": RECOVERY_EVENT, "time": time.time(), **fields}) + "\n"
        ).encode()
        self.write(line)
        return line

    def catch_up(self, data: bytes) -> int:
        """Take ``data`` (the run's log as an instance uploaded it to the bucket) when it
        continues this copy: lines logged while no supervisor followed the run. Returns
        the bytes added (0 when this copy is as long, or the two differ)."""
        self.close()
        mine = self.path.read_bytes() if self.path.exists() else b""
        if len(data) <= len(mine) or not data.startswith(mine):
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, data)
        return len(data) - len(mine)

    def cut_after(self, step: int, lost: Path) -> tuple[int, int]:
        """Move every line logged after checkpoint ``step`` was saved into ``lost``.

        The cut is right after the last ``checkpoint_saved`` line of ``step`` (the trainer's
        log context still says ``step`` for the next update's lines); without one (no
        checkpoint), at the first line of any step. Returns the last step the log had
        reached and how many lines moved.
        """
        self.close()
        lines = self.path.read_bytes().splitlines(keepends=True) if self.path.exists() else []
        events = [_event(line) for line in lines]
        steps = [e.get("step") for e in events]
        saved = [
            i
            for i, e in enumerate(events)
            if e.get("event") == "checkpoint_saved" and e.get("step") == step
        ]
        cut = (
            saved[-1] + 1
            if saved
            else next(
                (i for i, s in enumerate(steps) if isinstance(s, int) and s >= step), len(lines)
            )
        )
        last = max([s for s in steps if isinstance(s, int)] + [step])
        if cut < len(lines):
            with lost.open("ab") as fh:
                fh.write(b"".join(lines[cut:]))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, b"".join(lines[:cut]))
        return last, len(lines) - cut

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Leg:
    """The instance a supervisor works on now (its cost is in the run's record)."""

    instance_id: str
    attach: bool = False
    """Rented by an earlier supervisor: follow what runs there, boot nothing."""


@dataclass
class Pending:
    """A recovery under way: what the next launch resumes from, and its clock."""

    number: int
    reason: str
    resume_step: int
    checkpoint: Path | None
    steps_lost: int
    detected: float
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.monotonic() - self.detected
