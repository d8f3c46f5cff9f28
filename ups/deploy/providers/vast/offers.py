"""Choose the offer to rent: the first, in the API's order, at or under the price cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ups.deploy.providers import NoOffer


@dataclass(frozen=True)
class Offer:
    id: int
    dph_total: float
    """On-demand $/h including the requested disk."""
    min_bid: float
    gpu_name: str
    num_gpus: int
    geolocation: str
    machine_id: int | None = None
    """The physical machine; several offers can share one, and its faults follow it."""
    host_id: int | None = None

    @classmethod
    def from_api(cls, row: dict[str, Any]) -> Offer:
        return cls(
            id=int(row["id"]),
            dph_total=float(row.get("dph_total") or 0.0),
            min_bid=float(row.get("min_bid") or 0.0),
            gpu_name=str(row.get("gpu_name") or "?"),
            num_gpus=int(row.get("num_gpus") or 0),
            geolocation=str(row.get("geolocation") or "?"),
            machine_id=_int_or_none(row.get("machine_id")),
            host_id=_int_or_none(row.get("host_id")),
        )

    def price(self, interruptible: bool | float) -> float:
        """What renting costs per hour: the bid for interruptible, else ``dph_total``."""
        bid = bid_price(self, interruptible)
        return self.dph_total if bid is None else bid

    def describe(self) -> str:
        return f"offer {self.id}: {self.num_gpus}x {self.gpu_name} in {self.geolocation}"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def without_machines(rows: list[dict[str, Any]], machines: set[int]) -> list[dict[str, Any]]:
    """The search rows whose machine is not in ``machines`` (the ledger's, the tried ones)."""
    return [row for row in rows if _int_or_none(row.get("machine_id")) not in machines]


def bid_price(offer: Offer, interruptible: bool | float) -> float | None:
    """None on demand; ``true`` bids the offer's minimum, a number bids itself."""
    if interruptible is False:
        return None
    if interruptible is True:
        return offer.min_bid
    return float(interruptible)


def offer_type(interruptible: bool | float) -> str:
    return "on-demand" if interruptible is False else "bid"


def choose(
    rows: list[dict[str, Any]], cap: float, interruptible: bool | float, query: str
) -> Offer:
    """The first offer priced at or under ``cap``; else say the cheapest near miss."""
    offers = [Offer.from_api(row) for row in rows]
    for offer in offers:
        if offer.price(interruptible) <= cap and (
            interruptible is False or offer.price(interruptible) >= offer.min_bid
        ):
            return offer
    if not offers:
        raise NoOffer(
            f"no Vast offer matches {query!r}; nothing was created. Loosen the 'offer' query "
            "in hosts.yaml (try it with `vastai search offers '<query>'`)."
        )
    cheapest = min(offers, key=lambda o: max(o.price(interruptible), o.min_bid))
    price = max(cheapest.price(interruptible), cheapest.min_bid)
    raise NoOffer(
        f"no Vast offer matching {query!r} is at or under max_price_per_hour ${cap:.3f}/h; "
        f"the cheapest of {len(offers)} is {cheapest.describe()} at ${price:.3f}/h. Nothing "
        "was created. Raise max_price_per_hour in hosts.yaml or loosen the query."
    )
