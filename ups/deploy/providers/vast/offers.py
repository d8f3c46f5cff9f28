"""The offer requirements as Vast's search, and its rows as typed offers.

Vast's query language says the GPU count, memory and reliability itself; the GPU models
and regions people write (``A100`` for ``A100 SXM4``) are matched on the typed offers
(:meth:`~ups.deploy.providers.base.OfferRequirements.admits`), and the entry's own
``offer`` query narrows the search further.
"""

from __future__ import annotations

from typing import Any

from ups.deploy.providers.base import ORDER_PRICE, Offer, OfferRequirements

API_ORDER = "dph_total"
"""What a search by price is ordered by on Vast (the on-demand $/h with the disk)."""


def query_of(req: OfferRequirements) -> str:
    """The Vast query for ``req``: its own terms, then the entry's ``offer`` query."""
    terms = []
    if req.num_gpus is not None:
        terms.append(f"num_gpus={req.num_gpus}")
    if req.min_gpu_ram_gb is not None:
        terms.append(f"gpu_ram>={req.min_gpu_ram_gb:g}")  # the SDK turns GB into Vast's MB
    if req.min_reliability is not None:
        terms.append(f"reliability>={req.min_reliability:g}")
    if req.query:
        terms.append(req.query)
    return " ".join(terms)


def order_of(req: OfferRequirements) -> str:
    return API_ORDER if req.order == ORDER_PRICE else req.order


def offer_type(req: OfferRequirements) -> str:
    return "on-demand" if req.interruptible is False else "bid"


def offer_of(row: dict[str, Any], interruptible: bool) -> Offer:
    """One search row as a typed offer (the row itself rides along in ``data``)."""
    ram_mb = row.get("gpu_ram")
    reliability = row.get("reliability", row.get("reliability2"))
    return Offer(
        id=str(row["id"]),
        provider="vast",
        gpu_name=str(row.get("gpu_name") or "?"),
        num_gpus=int(row.get("num_gpus") or 0),
        gpu_ram_gb=float(ram_mb) / 1000.0 if ram_mb else None,
        price_per_hour=float(row.get("dph_total") or 0.0),
        region=str(row.get("geolocation") or "?"),
        interruptible=interruptible,
        min_bid_per_hour=float(row.get("min_bid") or 0.0),
        reliability=float(reliability) if reliability is not None else None,
        machine_id=_str_or_none(row.get("machine_id")),
        host_id=_str_or_none(row.get("host_id")),
        data=row,
    )


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
