"""Rentable machines, behind one interface (:mod:`ups.deploy.providers.base`), found
through one registry: this module.

A provider rents, lists and ends instances of machines it sells; it is one package under
``ups/deploy/providers/<name>/`` (a :class:`~ups.deploy.providers.base.ProviderPackage`)
and one line in :data:`_PACKAGES`. Managed runs (:mod:`ups.deploy.managed`) hold a
:class:`Provider` and ask its :class:`Capabilities`, never its name; this module is the
one place that maps a name to a concrete provider, and it imports a provider's package
(never its SDK) only when asked.
"""

from __future__ import annotations

import importlib

from ups.deploy.entries import RentedHost
from ups.deploy.providers.base import (
    EXIT_NO_OFFER,
    EXIT_PROVIDER_API,
    LABEL_PREFIX,
    ORDER_MEASURED,
    ORDER_PRICE,
    Account,
    ApiErrorKind,
    Backoff,
    Capabilities,
    ComputeWithSelfDestruct,
    ComputeWithStopResume,
    CreateRequest,
    Decision,
    Fault,
    Instance,
    InstanceState,
    Move,
    NoOffer,
    Offer,
    OfferRequirements,
    OfferTaken,
    Provider,
    ProviderApiError,
    ProviderPackage,
    RecoveryPolicy,
    RunLabel,
    Side,
    Situation,
    Trigger,
    api_error,
    gpu_key,
    gpu_matches,
    label_for,
    parse_label,
)

__all__ = [
    "EXIT_NO_OFFER",
    "EXIT_PROVIDER_API",
    "LABEL_PREFIX",
    "NAMES",
    "ORDER_MEASURED",
    "ORDER_PRICE",
    "UNNAMED",
    "Account",
    "ApiErrorKind",
    "Backoff",
    "Capabilities",
    "ComputeWithSelfDestruct",
    "ComputeWithStopResume",
    "CreateRequest",
    "Decision",
    "Fault",
    "Instance",
    "InstanceState",
    "Move",
    "NoOffer",
    "Offer",
    "OfferRequirements",
    "OfferTaken",
    "Provider",
    "ProviderApiError",
    "ProviderPackage",
    "RecoveryPolicy",
    "RunLabel",
    "Side",
    "Situation",
    "Trigger",
    "api_error",
    "gpu_key",
    "gpu_matches",
    "label_for",
    "open_provider",
    "options_models",
    "package",
    "parse_label",
]

_PACKAGES = {
    "vast": "ups.deploy.providers.vast",
    "runpod": "ups.deploy.providers.runpod",
}
"""The registry: a provider's name (its hosts.yaml ``kind``) -> its package."""
NAMES = tuple(_PACKAGES)
UNNAMED = "vast"
"""Whose ids a record or ledger entry written before providers were named holds (the
previous release rented from Vast only)."""


def package(name: str) -> ProviderPackage:
    """The package of provider ``name`` (imported now, its SDK not)."""
    found: ProviderPackage = importlib.import_module(_PACKAGES[name])
    return found


def options_models() -> dict[str, type[RentedHost]]:
    """Each provider's hosts.yaml model, by name (what ``kind: <name>`` is read with)."""
    return {name: package(name).Options for name in NAMES}


def open_provider(spec: RentedHost) -> Provider:
    """The provider that rents for the entry ``spec``, opened with its options."""
    return package(spec.kind).open_provider(spec)
