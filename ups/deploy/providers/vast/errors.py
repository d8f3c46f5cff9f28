"""Errors of the vast kind; each is one paragraph naming the problem and the fix."""

from __future__ import annotations

from ups.deploy.errors import DeployError

EXIT_VAST_API = 5
"""The Vast API refused or could not answer (no key, key rejected, rate limited, bad query)."""
EXIT_NO_OFFER = 6
"""No offer matched the query under the price cap; nothing was created."""
EXIT_INSTANCE = 7
"""The instance never became usable (image pull, never running, SSH never answering); for
bad hosts, after ``max_offers`` machines failed, each named with its failure."""
EXIT_RECOVERIES = 8
"""The run lost its instance more than ``max_recoveries`` times, or ``max_hours`` ran out
across instances; every instance was ended, the checkpoints are in the local run dir."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM locally; the instance was ended per ``on_exit`` first."""


class VastApiError(DeployError):
    exit_code = EXIT_VAST_API

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoOffer(DeployError):
    exit_code = EXIT_NO_OFFER


class OfferTaken(VastApiError):
    """The offer was rented by someone else between search and create: take the next one.

    Only when every offer tried was taken does it end the deploy, with exit 6 (no offer)."""

    exit_code = EXIT_NO_OFFER


class InstanceFailed(DeployError):
    exit_code = EXIT_INSTANCE


class Interrupted(DeployError):
    exit_code = EXIT_INTERRUPTED


class RecoveriesExhausted(DeployError):
    exit_code = EXIT_RECOVERIES
