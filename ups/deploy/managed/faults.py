"""Whose fault is a failed instance: the host's (try another machine) or the user's (stop).

A host fault is one another machine would not repeat: the provider's status naming a
broken driver or a corrupt image pull (``Provider.fault_of``), an instance that never
reaches running, SSH that never answers, a preflight check of the machine failing there.
The deploy destroys that instance, records the machine in the host ledger
(:mod:`ups.deploy.managed.ledger`) and rents the next matching offer, up to
``max_offers``. A user fault repeats on every host: the image does not exist or is not
authorised, ``setup`` fails on the user's command, the config is wrong. It stops the
deploy at once, and no further offer is rented.
"""

from __future__ import annotations

import re

from ups.deploy.managed.errors import InstanceFailed
from ups.deploy.providers import Side
from ups.preflight.figures import below_floor

__all__ = [
    "HOST_CHECKS",
    "HostFault",
    "Side",
    "UserFault",
    "failed_checks",
    "preflight_reason",
    "preflight_side",
]

HOST_CHECKS = frozenset({"gpu", "allreduce", "shm", "memory", "disk", "ulimits", "ports"})
"""Preflight checks that measure the machine; a failure of any other check (config, data,
cache, versions of the image, W&B credentials, the distributed env) repeats everywhere."""
_CHECK_ROW = re.compile(r"^(\w+)\s+FAIL\s", re.MULTILINE)


def failed_checks(report: str) -> list[str]:
    """Names of the checks a preflight table reports as FAIL."""
    return _CHECK_ROW.findall(report)


def preflight_side(report: str) -> Side:
    """HOST when every failed check measures the machine (and one failed), else USER.

    A burn-in row is the machine's when it failed by being below its floor; one that
    failed otherwise (the run's model would not build) is the user's."""
    failed = failed_checks(report)
    slow = below_floor(report)
    if failed and all(name in HOST_CHECKS or name in slow for name in failed):
        return Side.HOST
    return Side.USER


def preflight_reason(report: str) -> str:
    """The host fault in a few words: the failed checks, and each figure below its floor."""
    why = f"preflight failed there ({', '.join(failed_checks(report))})"
    slow = below_floor(report)
    return f"{why}: {'; '.join(slow.values())}" if slow else why


class HostFault(InstanceFailed):
    """This machine failed the run; the deploy may take another offer (exit 7 past the cap)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """The failure in a few words, as the host ledger records it."""


class UserFault(InstanceFailed):
    """Every machine would fail the same way: the deploy stops without another offer."""
