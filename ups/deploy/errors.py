"""Errors a deploy reports to the user: each carries the one-paragraph message and exit code."""

from __future__ import annotations

EXIT_DEPLOY = 3
"""Deploy could not reach, verify or set up the host; nothing was started."""
EXIT_PREFLIGHT = 4
"""Remote preflight failed; nothing was started."""


class DeployError(Exception):
    """A problem the user fixes (unknown host, unreachable, changed key...); message says how."""

    exit_code = EXIT_DEPLOY


class HostKeyChanged(DeployError):
    """The host presented a different key than the one recorded on first contact."""


class PreflightFailed(DeployError):
    """Remote preflight reported the host unfit; the report is in the message."""

    exit_code = EXIT_PREFLIGHT
