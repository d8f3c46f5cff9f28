"""Whose fault is a failed instance: the host's (try another machine) or the user's (stop).

A host fault is one another machine would not repeat: a driver or NVML error in the
container runtime, a truncated or corrupt image pull, an instance that never reaches
running, SSH that never answers, a preflight check failing there. The deploy destroys
that instance, records the machine in the host ledger (:mod:`ups.deploy.managed.ledger`) and
rents the next matching offer, up to ``max_offers``. A user fault repeats on every host:
the image does not exist or is not authorised, ``setup`` fails on the user's command, the
config is wrong. It stops the deploy at once, and no further offer is rented.

:data:`STATUS_RULES` is the one table of instance status messages that mean the instance
will never run; the first rule whose pattern matches decides. A status message no rule
knows is not fatal: the instance keeps its ``boot_timeout_s``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ups.deploy.providers.vast.errors import InstanceFailed


class Side(enum.Enum):
    HOST = "host"
    """Another machine would not repeat it: destroy, record the machine, next offer."""
    USER = "user"
    """Every machine would repeat it: stop, and burn no further offer."""


@dataclass(frozen=True, slots=True)
class StatusRule:
    pattern: str
    """A case-insensitive regular expression searched for in the instance's ``status_msg``."""
    side: Side
    meaning: str


STATUS_RULES: tuple[StatusRule, ...] = (
    # The user's image first: a pull that is refused names the registry's verdict, and the
    # same words can follow a generic "error pulling image".
    StatusRule(
        r"manifest unknown|manifest for \S+ not found",
        Side.USER,
        "the image (or its tag) does not exist in the registry",
    ),
    StatusRule(
        r"unauthorized|authentication required|pull access denied|"
        r"requested access to the resource is denied|repository does not exist",
        Side.USER,
        "the registry refuses the image: private, misspelt, or no login",
    ),
    StatusRule(r"invalid reference format", Side.USER, "the image name is not a valid reference"),
    StatusRule(
        r"nvidia-container-cli|nvml error|driver not loaded|"
        r"driver/library version mismatch|no cuda-capable device",
        Side.HOST,
        "the machine's NVIDIA driver or container runtime is broken",
    ),
    StatusRule(
        r"unexpected eof|failed to register layer|filesystem layer verification failed|"
        r"unexpected end of json input|digest mismatch|short read",
        Side.HOST,
        "the image pull on this machine was truncated or corrupt",
    ),
    StatusRule(r"no space left on device", Side.HOST, "the machine's disk is full"),
    StatusRule(
        r"error response from daemon|oci runtime|failed to create shim|"
        r"error starting container|cannot start container",
        Side.HOST,
        "the machine's Docker daemon could not start the container",
    ),
)
_COMPILED = tuple((re.compile(rule.pattern, re.IGNORECASE), rule) for rule in STATUS_RULES)


HOST_CHECKS = frozenset({"gpu", "allreduce", "shm", "memory", "disk", "ulimits", "ports"})
"""Preflight checks that measure the machine; a failure of any other check (config, data,
cache, versions of the image, W&B credentials, the distributed env) repeats everywhere."""
_CHECK_ROW = re.compile(r"^(\w+)\s+FAIL\s", re.MULTILINE)


def failed_checks(report: str) -> list[str]:
    """Names of the checks a preflight table reports as FAIL."""
    return _CHECK_ROW.findall(report)


def preflight_side(report: str) -> Side:
    """HOST when every failed check measures the machine (and one failed), else USER."""
    failed = failed_checks(report)
    if failed and all(name in HOST_CHECKS for name in failed):
        return Side.HOST
    return Side.USER


def classify_status(status_msg: str) -> StatusRule | None:
    """The first rule matching ``status_msg``; None when it is not known to be fatal."""
    for pattern, rule in _COMPILED:
        if pattern.search(status_msg or ""):
            return rule
    return None


class HostFault(InstanceFailed):
    """This machine failed the run; the deploy may take another offer (exit 7 past the cap)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """The failure in a few words, as the host ledger records it."""


class UserFault(InstanceFailed):
    """Every machine would fail the same way: the deploy stops without another offer."""
