"""Host kinds behind one interface, found through one registry.

Each kind (``container``, ``docker``, ``slurm``, ``rented``: an entry of any provider's
kind, and ``group``: one job on several container hosts, a composition of the container
kind) exposes ``KIND``, an object with
the :class:`HostKind` methods. :func:`of` and :func:`for_hosts` are the only places that
look at an entry's ``kind`` to choose; the callers (``ups.deploy.tasks``) never branch
on it. Kinds load on first use, so a docker deploy never imports a provider's SDK and no
kind imports torch.

As torchx's ``submit_dryrun``: :meth:`HostKind.plan` builds the whole deploy once, as an
object whose :meth:`KindPlan.render` is what ``--dry-run`` prints and whose
:meth:`KindPlan.run` executes those same commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TextIO

from ups.deploy.entries import RentedHost
from ups.deploy.errors import UsageError
from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, HostSpec
from ups.deploy.request import OPTIONS, DeployRequest, given
from ups.deploy.transport.remote import RemoteRun

GROUP = "group"
RENTED = "rented"
"""The kind of every provider's entry (``kind: vast``, ...): the managed run."""

_MODULES = {
    "container": "ups.deploy.kinds.container",
    "docker": "ups.deploy.kinds.docker",
    RENTED: "ups.deploy.kinds.rented",
    GROUP: "ups.deploy.kinds.group",
    "slurm": "ups.deploy.kinds.slurm",
}
NAMES = tuple(_MODULES)


class KindPlan(Protocol):
    """One deploy, planned: printed by ``--dry-run``, executed otherwise."""

    def choose_run(self) -> None:
        """Decide which run this deploy uses where the host holds the answer (a continued
        run), so that :meth:`render` names only that run; not called for ``--dry-run``."""
        ...

    def render(self) -> str:
        """What will run, every remote command as it is sent."""
        ...

    def run(self) -> int:
        """Carry the plan out (the commands :meth:`render` shows); the exit code."""
        ...


class HostKind(Protocol):
    """What deploy and its follow-up tasks need from a kind of host.

    Logs, status and fetch read the same remote layout on every kind
    (:mod:`ups.deploy.transport.remote`), so a kind takes part in them through :meth:`attach`;
    stop and preflight differ per kind and are methods.
    """

    name: str
    supported: frozenset[str]
    """Request fields (``ups.deploy.request.OPTIONS``) this kind honours; the rest are
    refused before anything is contacted."""
    instead: Mapping[str, str]
    """For a refused option: what to do instead (one sentence or two)."""

    def plan(
        self,
        request: DeployRequest,
        specs: Sequence[HostSpec],
        known_hosts: Path,
        out: TextIO,
    ) -> KindPlan:
        """Plan the deploy (contacting nothing but, for a rented entry, the offer search)."""
        ...

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        """The SSH-reachable host that runs (or ran) ``run`` for this entry."""
        ...

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        """The remote command `fab preflight` runs on this kind of host."""
        ...

    def stop_command(self, spec: HostSpec, run: RemoteRun, timeout_s: float) -> str:
        """The remote command that sends the run SIGTERM (`fab stop`)."""
        ...

    def status_command(self, spec: HostSpec, run: RemoteRun) -> str:
        """The remote command `fab status` runs: ``key=value`` lines
        (:func:`ups.deploy.transport.remote.status_command`)."""
        ...

    def down(self, spec: HostSpec, run: str | None, hosts_file: str | None, out: TextIO) -> int:
        """`fab down`: end what ups holds for this entry (a rented instance, a queued job)."""
        ...


def no_down(spec: HostSpec) -> UsageError:
    """`fab down` on a kind that holds nothing to end."""
    return UsageError(
        f"host {spec.name!r} is kind {spec.kind}: {command('down')} ends what ups holds for an "
        "entry (the instances it rented, the Slurm job it queued), and a "
        f"{spec.kind} host is yours. Stop a run on it with "
        f"{command('stop', '--host', spec.name)}."
    )


def get(name: str) -> HostKind:
    """The kind called ``name`` (its module is imported now, not before)."""
    kind: HostKind = importlib.import_module(_MODULES[name]).KIND
    return kind


def of(spec: HostSpec) -> HostKind:
    """The kind of one hosts.yaml entry (every provider's entry is the rented kind)."""
    return get(RENTED if isinstance(spec, RentedHost) else spec.kind)


def for_hosts(specs: Sequence[HostSpec], host: str) -> HostKind:
    """The kind that deploys to ``specs``: the entry's own kind, or ``group`` for several
    (a job on several hosts is made of container hosts only)."""
    if len(specs) == 1:
        return of(specs[0])
    if any(isinstance(spec, RentedHost) for spec in specs):
        raise UsageError(
            f"--host {host}: a rented entry rents its own single instance; it cannot be a "
            "node of a multi-host job yet. Deploy it alone (--host NAME)."
        )
    others = [f"{s.name} ({s.kind})" for s in specs if s.kind != "container"]
    if others:
        raise UsageError(
            f"a job on several hosts runs on `container` hosts only; {', '.join(others)} "
            "is not. Deploy to such a host on its own."
        )
    return get(GROUP)


def refuse_unsupported(request: DeployRequest, kind: HostKind, where: str) -> None:
    """Raise a UsageError (exit 2) naming the first option ``kind`` would not honour."""
    for name in given(request):
        if name in kind.supported:
            continue
        instead = kind.instead.get(name) or "deploy without it."
        raise UsageError(
            f"{OPTIONS[name]} is not supported by a {kind.name} host ({where}): {instead}"
        )
