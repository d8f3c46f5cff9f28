"""Choose the offer to rent: search the entry's provider with its requirements, leave out
the machines and offers that failed, rank (``order: measured``), and take the first at or
under the price cap; else say the cheapest near miss, or why every match was left out."""

from __future__ import annotations

from collections.abc import Collection

from ups.config import Config
from ups.deploy.entries import RentedHost
from ups.deploy.managed.ledger import Ledger
from ups.deploy.managed.ranking import rank
from ups.deploy.providers import ORDER_MEASURED, NoOffer, Offer, OfferRequirements, Provider
from ups.preflight.figures import workload


class NoneUnderCap(NoOffer):
    """Offers match, but none at or under the cap; ``short`` says so in one line (the
    reason a run moves to another provider)."""

    def __init__(self, message: str, short: str) -> None:
        super().__init__(message)
        self.short = short


def choose(
    offers: list[Offer], cap: float, interruptible: bool | float, title: str, wanted: str
) -> Offer:
    """The first offer priced at or under ``cap``; else say the cheapest near miss."""
    for offer in offers:
        if offer.affordable(cap, interruptible):
            return offer
    if not offers:
        raise NoOffer(
            f"no {title} offer matches {wanted}; nothing was created. Loosen the requirements "
            "of the entry in hosts.yaml (gpu, gpus, min_vram_gb, region, offer)."
        )
    cheapest = min(offers, key=lambda o: max(o.price(interruptible), o.min_bid_per_hour or 0.0))
    price = max(cheapest.price(interruptible), cheapest.min_bid_per_hour or 0.0)
    raise NoneUnderCap(
        f"no {title} offer matching {wanted} is at or under max_price_per_hour ${cap:.3f}/h; "
        f"the cheapest of {len(offers)} is {cheapest.describe()} at ${price:.3f}/h. Nothing "
        "was created. Raise max_price_per_hour in hosts.yaml or loosen the requirements.",
        f"the cheapest of {len(offers)} matching {title} offer(s) is ${price:.3f}/h, over the "
        f"cap ${cap:.3f}/h",
    )


def search(
    provider: Provider,
    spec: RentedHost,
    machines: Collection[str] = (),
    offers: Collection[str] = (),
    cfg: Config | None = None,
) -> tuple[Offer, tuple[str, ...], tuple[str, ...]]:
    """The first offer under the cap, leaving out ``offers``, ``machines`` and the machines
    the host ledger holds for this provider from the last ``ledger_ttl_h``; with the
    ledger's machines that matched and were left out, and (``order: measured`` with
    figures for ``cfg``'s workload) the ranking's lines, the chosen offer's first."""
    assert spec.max_price_per_hour is not None  # entries.py checks
    req = OfferRequirements.of(spec)
    matched = provider.search(req)
    book = Ledger()
    ledger = (
        book.excluded(spec.ledger_ttl_h, provider.name)
        if provider.capabilities.machine_identity
        else set()
    )
    avoided = tuple(sorted({o.machine_id for o in matched if o.machine_id in ledger}, key=_num))
    left_out = ledger | set(machines)
    kept = [o for o in matched if o.machine_id not in left_out and o.id not in offers]
    title = provider.account.title
    if matched and not kept:
        raise NoOffer(
            f"{len(matched)} {title} offer(s) matched {req.describe()}; all were excluded: "
            f"{'; '.join(_why_excluded(o, offers, machines) for o in matched[:8])}. "
            "Nothing more was created. Loosen the requirements in hosts.yaml, or lower "
            "ledger_ttl_h to try machines that failed here again (`ups hosts` lists why)."
        )
    ranked = None
    if spec.order == ORDER_MEASURED and cfg is not None:
        ranked = rank(kept, book.measurements(), workload(cfg), spec.interruptible)
    if ranked is not None:
        kept = [r.offer for r in ranked]
    offer = choose(kept, spec.max_price_per_hour, spec.interruptible, title, req.describe())
    if ranked is None:
        return offer, avoided, ()
    chosen = next(r for r in ranked if r.offer.id == offer.id)
    lines = tuple(r.line() for r in [chosen, *(r for r in ranked if r is not chosen)])
    return offer, avoided, lines


def _num(machine: str | None) -> tuple[int, str]:
    text = machine or ""
    return (int(text), "") if text.isdigit() else (0, text)


def _why_excluded(offer: Offer, offers: Collection[str], machines: Collection[str]) -> str:
    """Why one matching offer was left out, in words."""
    if offer.id in offers:
        why = "its instance was lost earlier in this run"
    elif offer.machine_id in machines:
        why = "its machine failed in this deploy"
    else:
        why = "its machine failed here before (the host ledger)"
    return f"offer {offer.id} on machine {offer.machine_id}: {why}"
