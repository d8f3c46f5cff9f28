"""Whose fault a Vast instance's status message says it is (``VastProvider.fault_of``).

:data:`STATUS_RULES` is the one table of instance status messages that mean the instance
will never run; the first rule whose pattern matches decides. A status message no rule
knows is not fatal: the instance keeps its ``boot_timeout_s``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ups.deploy.providers.base import Side


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


def classify_status(status_msg: str) -> StatusRule | None:
    """The first rule matching ``status_msg``; None when it is not known to be fatal."""
    for pattern, rule in _COMPILED:
        if pattern.search(status_msg or ""):
            return rule
    return None
