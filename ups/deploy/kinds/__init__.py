"""Host kinds behind one interface, found through one registry.

Each kind (``container``, ``docker``, ``vast``, and ``group``: one job on several
container hosts) is a module here exposing ``KIND``, an object with the
:class:`HostKind` methods. :func:`kind_for` is the only place that looks at an entry's
``kind`` to choose; the callers (``ups.deploy.tasks``) never branch on it. Kinds load on
first use, so a docker deploy never imports the Vast SDK and no kind imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, TextIO

from ups.deploy.errors import UsageError
from ups.deploy.hosts import HostSpec
from ups.deploy.remote import RemoteRun
from ups.deploy.request import DeployRequest

GROUP = "group"

_MODULES = {
    "container": "ups.deploy.kinds.container",
    "docker": "ups.deploy.kinds.docker",
    "vast": "ups.deploy.kinds.vast",
    GROUP: "ups.deploy.kinds.group",
}
NAMES = tuple(_MODULES)


class HostKind(Protocol):
    """What deploy needs from a kind of host."""

    name: str
    supported: frozenset[str]
    """Request fields (``ups.deploy.request.OPTIONS``) this kind honours; the rest are
    refused before anything is contacted."""
    instead: Mapping[str, str]
    """For a refused option: what to do instead (one sentence or two)."""

    def deploy(
        self, request: DeployRequest, specs: list[HostSpec], known_hosts: Path, out: TextIO
    ) -> int:
        """Plan, print the plan, and (unless ``request.dry_run``) run it."""
        ...

    def attach(self, spec: HostSpec, run: str | None) -> HostSpec:
        """The SSH-reachable host that runs (or ran) ``run`` for this entry."""
        ...

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        """The remote command `fab preflight` runs on this kind of host."""
        ...

    def stop_command(self, spec: HostSpec, run: RemoteRun, timeout_s: float) -> str:
        """The remote command that sends the run SIGTERM (`fab stop`)."""
        ...


def get(name: str) -> HostKind:
    """The kind called ``name`` (its module is imported now, not before)."""
    kind: HostKind = importlib.import_module(_MODULES[name]).KIND
    return kind


def kind_for(specs: list[HostSpec], host: str) -> HostKind:
    """The kind that deploys to ``specs``: the entry's own kind, or ``group`` for several."""
    if len(specs) == 1:
        return get(specs[0].kind)
    if any(spec.kind == "vast" for spec in specs):
        raise UsageError(
            f"--host {host}: a vast entry rents its own single instance; it cannot be a "
            "node of a multi-host job yet. Deploy it alone (--host NAME)."
        )
    return get(GROUP)
