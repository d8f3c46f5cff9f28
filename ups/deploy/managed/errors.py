"""How a managed run fails; each error is one paragraph naming the problem and the fix."""

from __future__ import annotations

from ups.deploy.errors import DeployError

EXIT_INSTANCE = 7
"""The instance never became usable (image pull, never running, SSH never answering); for
bad hosts, after ``max_offers`` machines failed, each named with its failure."""
EXIT_RECOVERIES = 8
"""The run lost its instance more than ``max_recoveries`` times, or ``max_hours`` ran out
across instances; every instance was ended, the checkpoints are in the local run dir."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM locally; the instance was ended per ``on_exit`` first."""


class InstanceFailed(DeployError):
    exit_code = EXIT_INSTANCE


class Interrupted(DeployError):
    exit_code = EXIT_INTERRUPTED


class RecoveriesExhausted(DeployError):
    exit_code = EXIT_RECOVERIES
