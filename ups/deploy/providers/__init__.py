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

from ups import exitcodes
from ups.deploy.errors import DeployError

LABEL_PREFIX = "ups:"

EXIT_PROVIDER_API = exitcodes.PROVIDER_API.code
EXIT_NO_OFFER = exitcodes.NOTHING_TO_RUN_ON.code


class ProviderApiError(DeployError):
    exit_code = EXIT_PROVIDER_API

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoOffer(DeployError):
    exit_code = EXIT_NO_OFFER


class OfferTaken(ProviderApiError):
    """The offer was rented by someone else between search and create: take the next one.

    Only when every offer tried was taken does it end the deploy, with exit 6 (no offer)."""

    exit_code = EXIT_NO_OFFER


class Side(enum.Enum):
    """Whose fault a failure on a rented machine is."""

    HOST = "host"
    """Another machine would not repeat it: destroy, record the machine, next offer."""
    USER = "user"
    """Every machine would repeat it: stop, and burn no further offer."""


def label_for(host: str, run_id: str) -> str:
    """The label ups gives an instance: the hosts.yaml entry and the run it serves."""
    return f"{LABEL_PREFIX}{host}:{run_id}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """``(host, run_id)`` of a ups label, or None for instances ups did not create."""
    if not label or not label.startswith(LABEL_PREFIX):
        return None
    host, _, run_id = label[len(LABEL_PREFIX) :].partition(":")
    return (host, run_id) if run_id else None


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

    @property
    def id(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def status_msg(self) -> str: ...
    @property
    def ssh_host(self) -> str | None: ...
    @property
    def ssh_port(self) -> int | None: ...
    @property
    def dph_total(self) -> float: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def machine_id(self) -> int | None: ...
    @property
    def state(self) -> InstanceState: ...
    @property
    def cost_so_far(self) -> float: ...


class Provider(Protocol):
    """The calls a managed run makes on a provider; each raises the provider's own
    ``DeployError`` paragraph (exit code included) when it cannot be done."""

    name: str

    def search_offers(
        self, query: str, order: str, offer_type: str, disk_gb: float
    ) -> list[dict[str, Any]]:
        """Offers matching ``query`` (the provider's rows), in ``order``."""
        ...

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

    def fault_of(self, instance: RentedInstance) -> tuple[Side, str] | None:
        """Whose fault it is that ``instance`` will never run, and what it means in a few
        words; None when its status says nothing fatal."""
        ...


_MODULES = {"vast": "ups.deploy.providers.vast.provider"}
NAMES = tuple(_MODULES)


def get(name: str, **options: Any) -> Provider:
    """The provider called ``name``, opened with ``options`` (e.g. its API's URL)."""
    module = importlib.import_module(_MODULES[name])
    provider: Provider = module.open_provider(**options)
    return provider
