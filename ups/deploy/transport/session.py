"""What every host kind shares: a resolved target, its verified connection, remote commands.

:mod:`ups.deploy.onhost.operate` (the ``container`` kind and the follow-up tasks) and
:mod:`ups.deploy.kinds.docker` both build on this module and never on each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fabric import Connection

from ups.deploy.entries import AddressedHost, SshHost
from ups.deploy.errors import PreflightFailed
from ups.deploy.transport import remote as rc
from ups.deploy.transport.connect import connect
from ups.log import get_logger, render_line

log = get_logger("deploy")

_SAY = threading.Lock()
"""Nodes of one job are followed in threads; a line is written whole, never interleaved."""


@dataclass
class Target:
    """A host from hosts.yaml, where its keys are checked, and where output goes."""

    spec: AddressedHost
    known_hosts: Path
    out: TextIO
    label: str = ""
    """Prefix for every line shown for this host (``[node1] ``) when a job spans hosts."""

    def connect(self) -> Connection:
        return connect(self.spec, self.known_hosts)

    def labelled(self, text: str) -> str:
        """``text`` with this host's label on every line."""
        if not self.label:
            return text
        return "\n".join(f"{self.label}{line}" for line in text.split("\n"))

    def say(self, text: str) -> None:
        text = self.labelled(text)
        with _SAY:
            self.out.write(text + "\n")
            self.out.flush()


def run(conn: Connection, command: str, spec: SshHost) -> Any:
    """Run a shell command built by :mod:`ups.deploy.transport.remote`; never raises on exit status.

    The one place deploy runs a remote command (log streams and fetch's tar open their own
    channels): each is logged as a ``remote_command`` debug event, so a test can compare
    what ran with what ``--dry-run`` printed."""
    log.debug("remote_command", host=spec.name, command=command)
    return conn.run(rc.with_env(spec.remote_env, command), hide=True, warn=True, in_stream=False)


def write_private(conn: Connection, path: str, text: str) -> None:
    """Write ``text`` to a remote file that only its owner can read (mode 0600 before data)."""
    sftp = conn.sftp()
    with sftp.open(path, "w") as fh:
        fh.chmod(0o600)
        fh.write(text.encode())


def replace_private(conn: Connection, path: str, text: str) -> None:
    """Replace a remote 0600 file whole: a reader sees the old text or the new, never a
    part (written beside it, then renamed over it)."""
    sftp = conn.sftp()
    part = f"{path}.part"
    with sftp.open(part, "w") as fh:
        fh.chmod(0o600)
        fh.write(text.encode())
    sftp.posix_rename(part, path)


def write_text(conn: Connection, path: str, text: str) -> None:
    with conn.sftp().open(path, "w") as fh:
        fh.write(text.encode())


def show_report(target: Target, text: str) -> None:
    """Show the remote preflight output once; JSON log lines are rendered for people.

    The preflight CLI prints its table and, off a terminal, the same results again as
    JSON events. The table is for people: JSON lines that repeat a check are dropped.
    """
    colors = target.out.isatty()
    lines = [
        render_line(line, colors=colors)
        for line in text.rstrip().splitlines()
        if not _is_check_event(line)
    ]
    target.say(f"remote preflight on {target.spec.name}:\n" + "\n".join(lines))


def _is_check_event(line: str) -> bool:
    return line.startswith("{") and '"check"' in line


def remote_preflight(target: Target, conn: Connection, command: str) -> str:
    """Run preflight on the host (``command``, as planned), show its report and return it;
    raise with the report on failure."""
    spec = target.spec
    result = run(conn, command, spec)
    report: str = result.stdout + result.stderr
    show_report(target, report)
    if result.exited != 0:
        raise PreflightFailed(
            f"preflight failed on {spec.name!r} (exit {result.exited}); nothing was started. "
            "Fix the failing checks above (each names its fix) and deploy again.",
            report,
        )
    return report
