"""Vast as a :class:`~ups.deploy.providers.base.Provider`: typed offers and instances over
its own SDK (:class:`~ups.deploy.providers.vast.client.VastApi`: retries, readable errors)."""

from __future__ import annotations

from ups.deploy.providers.base import (
    ORDER_PRICE,
    ApiErrorKind,
    Capabilities,
    CreateRequest,
    Fault,
    Instance,
    Offer,
    OfferRequirements,
    ProviderApiError,
    parse_label,
)
from ups.deploy.providers.vast.client import ACCOUNT, BACKOFF, VastApi, classify
from ups.deploy.providers.vast.faults import classify_status
from ups.deploy.providers.vast.instance import instance_of
from ups.deploy.providers.vast.offers import offer_of, offer_type, order_of, query_of

CAPABILITIES = Capabilities(
    interruptible=True,  # bids: an outbid instance shows stopped and keeps its disk
    stop_resume=True,
    labels=True,
    self_destruct=True,  # the instance's own CONTAINER_API_KEY (or a scoped key) ends it
    machine_identity=True,  # offers carry machine_id and host_id
)


class VastProvider:
    """Vast's instances through its own SDK."""

    name = "vast"
    account = ACCOUNT
    capabilities = CAPABILITIES
    backoff = BACKOFF

    def __init__(self, api: VastApi) -> None:
        self.api = api

    def search(self, requirements: OfferRequirements) -> list[Offer]:
        kind = offer_type(requirements)
        rows = self.api.search_offers(
            query_of(requirements), order_of(requirements), kind, requirements.disk_gb
        )
        offers = [offer_of(row, interruptible=kind == "bid") for row in rows]
        found = [o for o in offers if requirements.admits(o)]
        if requirements.order == ORDER_PRICE:  # stable: Vast's order among equal prices
            found.sort(key=lambda o: o.price(requirements.interruptible))
        return found

    def create(self, offer: Offer, request: CreateRequest) -> str:
        fields: dict[str, object] = {
            "image": request.image,
            "disk": request.disk_gb,
            "label": request.label,
            "onstart_cmd": request.onstart,
            "ssh": True,
            "direct": True,
        }
        if request.env:
            fields["env"] = dict(request.env)
        if request.bid_per_hour is not None:
            fields["bid_price"] = request.bid_per_hour
        result = self.api.create(int(offer.id), **fields)
        instance_id = result.get("new_contract") if isinstance(result, dict) else None
        if not instance_id:
            raise ProviderApiError(
                f"creating an instance from offer {offer.id} failed: {result}. The offer "
                "may have just been taken; run the deploy again to pick another."
            )
        return str(instance_id)

    def get(self, instance_id: str) -> Instance | None:
        row = self.api.show(int(instance_id))
        return instance_of(row) if row else None

    def list(self, run_id: str | None = None) -> list[Instance]:
        found = []
        for row in self.api.list():
            run = parse_label(str(row.get("label") or ""))
            if run is not None and run_id in (None, run.run_id):
                found.append(instance_of(row))
        return found

    def stop(self, instance_id: str) -> None:
        self.api.stop(int(instance_id))

    def destroy(self, instance_id: str) -> None:
        try:
            self.api.destroy(int(instance_id))
        except ProviderApiError as err:
            if err.kind is not ApiErrorKind.NOT_FOUND:
                raise  # gone already: what a destroy wants

    def fault_of(self, instance: Instance) -> Fault | None:
        rule = classify_status(instance.status_message)
        return Fault(rule.side, rule.meaning) if rule is not None else None

    def classify(self, status: int | None, body: object) -> ApiErrorKind:
        return classify(status, body)
