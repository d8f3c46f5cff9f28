"""Rentable machines, behind one interface: :class:`Provider`, found through one registry.

A provider rents, lists and ends instances of machines it sells (Vast today:
:mod:`ups.deploy.providers.vast`). Managed runs (:mod:`ups.deploy.managed`) hold a
:class:`Provider` and never look at which one it is; :func:`get` is the one place that
maps a name to a concrete provider, and it imports that provider's module (and its SDK)
only when asked.
"""

from __future__ import annotations

import enum
import importlib
from typing import Any, Protocol


class InstanceState(enum.Enum):
    """One instance's state, as every provider reports it::

    LOADING --> RUNNING --> STOPPED          (stopped by us or by the user)
       |           |------> OUTBID           (the provider took it back: a bid lost)
       |           '------> GONE             (destroyed; the provider no longer lists it)
       '------> FAILED                       (image pull error, offline host)
    """

    LOADING = "loading"
    RUNNING = "running"
    STOPPED = "stopped"
    OUTBID = "outbid"
    FAILED = "failed"
    GONE = "gone"


class RentedInstance(Protocol):
    """What the managed run reads of an instance, whatever its provider."""

    id: int
    label: str
    status_msg: str
    ssh_host: str | None
    ssh_port: int | None
    dph_total: float
    duration_s: float
    machine_id: int | None

    @property
    def state(self) -> InstanceState: ...


class Provider(Protocol):
    """The calls a managed run makes on a provider; each raises the provider's own
    ``DeployError`` paragraph (exit code included) when it cannot be done."""

    name: str

    def get(self, instance_id: int) -> RentedInstance | None:
        """The instance now, or None when the provider no longer lists it (gone)."""
        ...

    def list(self, label: str | None = None) -> list[RentedInstance]:
        """Every instance of this account, or only those labelled ``label``."""
        ...

    def create(self, offer_id: int, **fields: Any) -> int:
        """Rent ``offer_id``; the new instance's id."""
        ...

    def stop(self, instance_id: int) -> None: ...

    def destroy(self, instance_id: int) -> None: ...


_MODULES = {"vast": "ups.deploy.providers.vast.provider"}
NAMES = tuple(_MODULES)


def get(name: str, **options: Any) -> Provider:
    """The provider called ``name``, opened with ``options`` (e.g. its API's URL)."""
    module = importlib.import_module(_MODULES[name])
    provider: Provider = module.open_provider(**options)
    return provider
