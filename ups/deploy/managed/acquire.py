"""Rent one instance for a run, moving past bad machines: up to ``max_offers`` offers.

:func:`rent` is the one way a deploy or a recovery gets an instance. It creates one from
the plan's offer and hands it to ``use`` (boot, setup, preflight, train). When ``use``
raises a :class:`~ups.deploy.managed.faults.HostFault`, the instance is destroyed, its
machine recorded in the host ledger, and the next matching offer taken (machines tried in
this call and those in the ledger left out); an offer someone else rented first is
skipped the same way, without a ledger entry. A user fault, or any other error, ends the
call at once. After ``max_offers`` offers it raises :class:`OffersExhausted` (exit 7),
naming every machine tried and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ups.deploy.errors import DeployError
from ups.deploy.managed.errors import EXIT_INSTANCE
from ups.deploy.managed.faults import HostFault
from ups.deploy.managed.ledger import Failure, Ledger
from ups.deploy.managed.lifecycle import Lifecycle
from ups.deploy.providers import NoOffer, OfferTaken

T = TypeVar("T")


class OffersExhausted(DeployError):
    exit_code = EXIT_INSTANCE


def rent(lc: Lifecycle, use: Callable[[int], T], ledger: Ledger | None = None) -> T:
    """Create an instance for ``lc.plan`` and return ``use(instance_id)``; on a host fault
    or a taken offer, move ``lc.plan`` to the next offer, up to ``max_offers`` tries."""
    ledger = ledger or Ledger()
    spec = lc.plan.spec
    tried: list[str] = []
    offers: set[int] = set()
    machines: set[int] = set()
    only_taken = True
    while True:
        offer = lc.plan.offer
        offers.add(offer.id)
        started = time.monotonic()
        try:
            instance_id = lc.create()
        except OfferTaken as err:
            tried.append(f"offer {offer.id}: taken by someone else before the create")
            lc.say(f"offer {offer.id}: {err}")
        else:
            try:
                return use(instance_id)
            except HostFault as fault:
                only_taken = False
                _bad_host(lc, ledger, instance_id, fault)
                if offer.machine_id is not None:
                    machines.add(offer.machine_id)
                spent = time.monotonic() - started
                tried.append(
                    f"machine {offer.machine_id} (offer {offer.id}, instance {instance_id}): "
                    f"{fault.reason}"
                )
                lc.timings[f"bad host {len(tried)}"] = spent
        if len(tried) >= spec.max_offers:
            raise _exhausted(lc, tried, only_taken)
        try:
            lc.plan = lc.plan.with_next_offer(lc.provider, offers, machines)
        except NoOffer as err:
            raise _exhausted(lc, tried, only_taken, f" No further offer: {err}") from None
        lc.say(
            f"trying the next offer ({len(tried) + 1}/{spec.max_offers}): "
            f"{lc.plan.offer.describe()} on machine {lc.plan.offer.machine_id} at "
            f"${lc.plan.price:.3f}/h"
        )


def _bad_host(lc: Lifecycle, ledger: Ledger, instance_id: int, fault: HostFault) -> None:
    """Destroy the instance and record its machine, saying so."""
    plan = lc.plan
    offer = plan.offer
    lc.say(
        f"machine {offer.machine_id} (offer {offer.id}) failed: {fault.reason}; destroying "
        f"instance {instance_id} and leaving the machine out for ledger_ttl_h "
        f"{plan.spec.ledger_ttl_h:g} h"
    )
    try:
        lc.discard(instance_id, f"bad host: {fault.reason}")
    except DeployError as err:
        lc.say(f"warning: could not destroy instance {instance_id} yet: {err}")
    if offer.machine_id is None:
        return
    ledger.record(
        Failure(
            machine_id=offer.machine_id,
            host_id=offer.host_id,
            offer_id=offer.id,
            instance_id=instance_id,
            failure=fault.reason,
            at=time.time(),
            run_id=plan.run_id,
            host=plan.spec.name,
        )
    )


def _exhausted(lc: Lifecycle, tried: list[str], only_taken: bool, tail: str = "") -> DeployError:
    spec = lc.plan.spec
    listed = "; ".join(tried)
    if only_taken:
        return NoOffer(
            f"every offer tried was taken by someone else before ups could rent it ({listed})."
            f"{tail} Run the deploy again in a minute, or loosen the 'offer' query in "
            "hosts.yaml."
        )
    return OffersExhausted(
        f"{len(tried)} offer(s) tried for run {lc.plan.run_id} and none gave a usable "
        f"instance: {listed}.{tail} Each failed machine was destroyed and is left out of "
        f"searches for ledger_ttl_h ({spec.ledger_ttl_h:g} h; `ups hosts` lists them). Deploy "
        "again to try further offers, or raise max_offers in hosts.yaml."
    )
