"""The neutral offer requirements as RunPod's GPU types and prices.

RunPod rents a GPU *type* (``gpuTypeId``, e.g. ``NVIDIA GeForce RTX 4090``) and picks the
machine itself, so an offer here is one GPU type at the requested count, in one country
when the entry names regions, with the lowest price RunPod quotes for it
(``lowestPrice(input: {gpuCount})``: per GPU, on demand and the least spot bid). A type
without stock at that count is no offer. RunPod names no machine before the create
(``Offer.machine_id`` is None: the host ledger cannot leave one out) and reports no
reliability. The entry's ``offer:`` (the escape hatch) lists exact ``gpuTypeId``s.
"""

from __future__ import annotations

from typing import Any

from ups.deploy.providers.base import Offer, OfferRequirements
from ups.deploy.providers.runpod.pods import PROVIDER

DISK_PER_GB_MONTH = 0.10
"""$/GB/month a running pod's volume bills (RunPod's pricing): part of its $/h."""
HOURS_PER_MONTH = 730.0


def gpu_types_query(num_gpus: int, cloud_type: str, country: str | None) -> str:
    """One query for every GPU type with its lowest price at ``num_gpus``."""
    args = [f"gpuCount: {int(num_gpus)}"]
    if cloud_type != "ALL":
        args.append(f"secureCloud: {'true' if cloud_type == 'SECURE' else 'false'}")
    if country:
        args.append(f'countryCode: "{country}"')
    return (
        "query GpuTypes { gpuTypes { id displayName memoryInGb secureCloud communityCloud "
        f"lowestPrice(input: {{{', '.join(args)}}}) "
        "{ minimumBidPrice uninterruptablePrice stockStatus } } }"
    )


def offers_of(
    rows: list[dict[str, Any]],
    req: OfferRequirements,
    num_gpus: int,
    cloud_type: str,
    country: str | None,
) -> list[Offer]:
    """The GPU types of one ``gpuTypes`` answer that meet ``req`` (all but the cap)."""
    wanted_ids = {t.strip() for t in (req.query or "").split(",") if t.strip()}
    disk = req.disk_gb * DISK_PER_GB_MONTH / HOURS_PER_MONTH
    found = []
    for row in rows:
        price = row.get("lowestPrice") or {}
        on_demand = price.get("uninterruptablePrice")
        if on_demand is None or not price.get("stockStatus"):
            continue  # none free at this count
        if wanted_ids and row["id"] not in wanted_ids:
            continue
        bid = price.get("minimumBidPrice")
        offer = Offer(
            id=f"{row['id']}|{num_gpus}|{cloud_type}|{country or ''}",
            provider=PROVIDER,
            gpu_name=str(row["id"]),
            num_gpus=num_gpus,
            gpu_ram_gb=float(row["memoryInGb"]) if row.get("memoryInGb") else None,
            price_per_hour=round(float(on_demand) * num_gpus + disk, 4),
            region=country or cloud_type,
            interruptible=bid is not None,
            min_bid_per_hour=round(float(bid) * num_gpus, 4) if bid is not None else None,
            data={
                "gpu_type_id": row["id"],
                "gpu_count": num_gpus,
                "cloud_type": cloud_type,
                "country_code": country,
            },
        )
        if req.admits(offer):
            found.append(offer)
    return found
