"""Vast as a :class:`ups.deploy.providers.Provider`: the API's rows as typed instances."""

from __future__ import annotations

from typing import Any

from ups.deploy.providers.vast.client import VastApi
from ups.deploy.providers.vast.instance import Instance


class VastProvider:
    """Vast's instances through its own SDK (:class:`VastApi`: retries, readable errors)."""

    name = "vast"

    def __init__(self, api: VastApi) -> None:
        self.api = api

    def get(self, instance_id: int) -> Instance | None:
        row = self.api.show(instance_id)
        return Instance.from_api(row) if row else None

    def list(self, label: str | None = None) -> list[Instance]:
        rows = self.api.list()
        return [Instance.from_api(r) for r in rows if label is None or r.get("label") == label]

    def create(self, offer_id: int, **fields: Any) -> int:
        return int(self.api.create(offer_id, **fields)["new_contract"])

    def stop(self, instance_id: int) -> None:
        self.api.stop(instance_id)

    def destroy(self, instance_id: int) -> None:
        self.api.destroy(instance_id)


def open_provider(vast_url: str | None = None) -> VastProvider:
    """The registry's entry point (:func:`ups.deploy.providers.get`)."""
    return VastProvider(VastApi(vast_url))
