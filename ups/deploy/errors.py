"""Errors a deploy reports to the user: each carries the one-paragraph message and exit code.

Exit codes of the ``fab`` tasks (docs/deploy.md): 2 a mistake in the run config, the
hosts file or a flag (nothing was contacted); 3 the host could not be reached, verified
or set up (nothing was started); 4 remote preflight failed (nothing was started);
otherwise the run's own exit code (0 finished, 75 preempted, 1 failed...); 130 Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from ups import exitcodes

# What each means: ups.exitcodes (docs/reference/exit-codes.md).
EXIT_USAGE = exitcodes.USAGE.code
EXIT_DEPLOY = exitcodes.DEPLOY.code
EXIT_PREFLIGHT = exitcodes.REMOTE_PREFLIGHT.code
EXIT_INTERRUPTED = exitcodes.INTERRUPTED.code


class DeployError(Exception):
    """A problem the user fixes (unreachable host, changed key...); the message says how."""

    exit_code = EXIT_DEPLOY


class HostGone(DeployError):
    """The host a follow-up task needs is gone; ``replay`` (when set) writes what the run
    left elsewhere (its log in its bucket or its local run directory) and returns a code."""

    def __init__(self, message: str, replay: Callable[[TextIO], int] | None = None) -> None:
        super().__init__(message)
        self.replay = replay


class UsageError(DeployError):
    """A mistake in the run config, hosts.yaml or a flag, found before any connection."""

    exit_code = EXIT_USAGE


class HostKeyChanged(DeployError):
    """The host presented a different key than the one recorded on first contact."""


class PreflightFailed(DeployError):
    """Remote preflight reported the host unfit; the report is in the message."""

    exit_code = EXIT_PREFLIGHT

    def __init__(self, message: str, report: str = "") -> None:
        super().__init__(message)
        self.report = report
        """The report as preflight printed it (its table names each check's status)."""
