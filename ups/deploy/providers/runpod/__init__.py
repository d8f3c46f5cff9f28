"""RunPod as a provider (docs/runpod.md): :mod:`entry` (``kind: runpod`` in hosts.yaml),
:mod:`client` (retries and the one error paragraph; the API with the standard library),
:mod:`sdk` (the real ``runpod`` SDK, on the laptop only),
:mod:`offers` (the neutral requirements as RunPod GPU types and prices), :mod:`pods` (a pod
as a typed instance; the pod's start command), :mod:`provider` (the
:class:`~ups.deploy.providers.base.Provider`), :mod:`on_pod` (the watchdog's view: the pod
ends itself with its own scoped key, without the SDK, which the image lacks).

This module is the registry's :class:`~ups.deploy.providers.base.ProviderPackage`; it
imports the SDK only when a provider is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.deploy.entries import RentedHost
from ups.deploy.providers.runpod.entry import RunPodHost

if TYPE_CHECKING:
    from ups.deploy.providers.runpod.on_pod import OnPod
    from ups.deploy.providers.runpod.provider import RunPodProvider

Options = RunPodHost


def open_provider(options: RentedHost) -> RunPodProvider:
    from ups.deploy.providers.runpod.provider import RunPodProvider
    from ups.deploy.providers.runpod.sdk import RunPodApi

    assert isinstance(options, RunPodHost), options
    return RunPodProvider(RunPodApi(options.runpod_url), options)


def on_instance(endpoint: str | None, key: str | None) -> OnPod:
    from ups.deploy.providers.runpod.on_pod import OnPod

    return OnPod(endpoint, key)


def watchdog_endpoint(options: RentedHost) -> str | None:
    assert isinstance(options, RunPodHost), options
    return options.runpod_url
