"""Vast as a :class:`ups.deploy.providers.Provider`: the API's rows as typed instances."""

from __future__ import annotations

from typing import Any

from ups.deploy.providers import ProviderApiError, Side
from ups.deploy.providers.vast.client import VastApi
from ups.deploy.providers.vast.faults import classify_status
from ups.deploy.providers.vast.instance import Instance


class VastProvider:
    """Vast's instances through its own SDK (:class:`VastApi`: retries, readable errors)."""

    name = "vast"

    def __init__(self, api: VastApi) -> None:
        self.api = api

    def search_offers(
        self, query: str, order: str, offer_type: str, disk_gb: float
    ) -> list[dict[str, Any]]:
        return self.api.search_offers(query, order, offer_type, disk_gb)

    def get(self, instance_id: int) -> Instance | None:
        row = self.api.show(instance_id)
        return Instance.from_api(row) if row else None

    def list(self, label: str | None = None) -> list[Instance]:
        rows = self.api.list()
        return [Instance.from_api(r) for r in rows if label is None or r.get("label") == label]

    def create(self, offer_id: int, **fields: Any) -> int:
        result = self.api.create(offer_id, **fields)
        instance_id = result.get("new_contract") if isinstance(result, dict) else None
        if not instance_id:
            raise ProviderApiError(
                f"creating an instance from offer {offer_id} failed: {result}. The offer "
                "may have just been taken; run the deploy again to pick another."
            )
        return int(instance_id)

    def stop(self, instance_id: int) -> None:
        self.api.stop(instance_id)

    def destroy(self, instance_id: int) -> None:
        self.api.destroy(instance_id)

    def fault_of(self, instance: Instance) -> tuple[Side, str] | None:
        rule = classify_status(instance.status_msg)
        return (rule.side, rule.meaning) if rule is not None else None


def open_provider(vast_url: str | None = None) -> VastProvider:
    """The registry's entry point (:func:`ups.deploy.providers.get`)."""
    return VastProvider(VastApi(vast_url))
