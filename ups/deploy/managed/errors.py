"""How a managed run fails; each error is one paragraph naming the problem and the fix."""

from __future__ import annotations

from ups import exitcodes
from ups.deploy.errors import DeployError

# What each means: ups.exitcodes (docs/reference/exit-codes.md).
EXIT_INSTANCE = exitcodes.INSTANCE_UNUSABLE.code
EXIT_RECOVERIES = exitcodes.RECOVERIES_EXHAUSTED.code
EXIT_INTERRUPTED = exitcodes.INTERRUPTED.code


class InstanceFailed(DeployError):
    exit_code = EXIT_INSTANCE


class Interrupted(DeployError):
    exit_code = EXIT_INTERRUPTED


class RecoveriesExhausted(DeployError):
    exit_code = EXIT_RECOVERIES
