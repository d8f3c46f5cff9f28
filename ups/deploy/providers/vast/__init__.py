"""Vast.ai as a provider (a :class:`~ups.deploy.providers.base.ProviderPackage`):
:mod:`options` (its hosts.yaml entry), :mod:`client` (the real ``vastai`` SDK with its
account words, backoff and errors), :mod:`provider` (the
:class:`~ups.deploy.providers.base.Provider` over it), :mod:`instance` (an API row as a
typed instance), :mod:`offers` (requirements as Vast's query, rows as typed offers),
:mod:`faults` (whose fault a status message is), :mod:`inside` (what the watchdog on the
instance may do). Importing this package does not import the ``vastai`` SDK."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.deploy.entries import RentedHost
from ups.deploy.providers.vast.options import VastHost

if TYPE_CHECKING:
    from ups.deploy.providers.vast.inside import OnInstance
    from ups.deploy.providers.vast.provider import VastProvider

Options = VastHost


def open_provider(options: RentedHost) -> VastProvider:
    """The registry's entry point (:func:`ups.deploy.providers.open_provider`)."""
    from ups.deploy.providers.vast.client import VastApi
    from ups.deploy.providers.vast.provider import VastProvider

    assert isinstance(options, VastHost), options
    return VastProvider(VastApi(options.vast_url))


def on_instance(endpoint: str | None, key: str | None) -> OnInstance:
    """What the watchdog on a Vast instance may do (with the scoped key or the instance's)."""
    from ups.deploy.providers.vast.inside import OnInstance

    return OnInstance(endpoint, key)


def watchdog_endpoint(options: RentedHost) -> str | None:
    assert isinstance(options, VastHost), options
    return options.vast_url
