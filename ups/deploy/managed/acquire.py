"""Rent one instance for a run, moving past bad machines, taken offers and providers without
an offer, as the run's :class:`~ups.deploy.providers.base.RecoveryPolicy` decides.

:func:`rent` is the one way a deploy or a recovery gets an instance. It creates one from
the plan's offer and hands it to ``use`` (boot, setup, preflight, train). When ``use``
raises a :class:`~ups.deploy.managed.faults.HostFault`, the instance is destroyed, its
machine recorded in the host ledger, and the policy asked where to go: the next matching
offer (machines tried in this call and those in the ledger left out), or another entry's
provider after ``max_offers`` bad hosts in a row. An offer someone else rented first is
skipped the same way, without a ledger entry. A user fault, or any other error, ends the
call at once. When the policy gives up it raises :class:`OffersExhausted` (exit 7), naming
every machine tried and why, or :class:`~ups.deploy.providers.base.NoOffer` (exit 6).
:func:`move_on` carries out the policy's decisions until the plan holds an offer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TypeVar

from ups.deploy.errors import DeployError
from ups.deploy.managed.errors import EXIT_INSTANCE
from ups.deploy.managed.faults import HostFault
from ups.deploy.managed.ledger import Failure, Ledger
from ups.deploy.managed.lifecycle import Lifecycle
from ups.deploy.managed.market import Market
from ups.deploy.managed.offers import NoneUnderCap
from ups.deploy.managed.ranking import on_machine
from ups.deploy.providers import (
    Move,
    NoOffer,
    Offer,
    OfferTaken,
    Provider,
    RecoveryPolicy,
    Situation,
    Trigger,
)

T = TypeVar("T")


class OffersExhausted(DeployError):
    exit_code = EXIT_INSTANCE


OnMove = Callable[[str, str, str], object]
"""Called with (from entry, to entry, why) when the run moves to another provider."""


@dataclass
class Where:
    """Where the run is looking for an instance, and what it left out there."""

    market: Market
    policy: RecoveryPolicy
    on_move: OnMove
    offers: set[tuple[str, str]] = field(default_factory=set)
    """(provider, offer id) not to take again: taken, on a bad host, or one machine that
    lost the run (:meth:`lost`)."""
    machines: set[tuple[str, str]] = field(default_factory=set)
    """(provider, machine id) that failed in this deploy."""
    without_offer: set[str] = field(default_factory=set)
    """Entries whose last search found nothing under the cap."""

    def lost(self, offer: Offer, provider: Provider) -> None:
        """An instance rented from ``offer`` was lost (taken back, gone, unreachable). Where
        the provider's offers name their machine, the offer is that machine: it is left out
        of later searches. Where the provider picks a machine at every create (an offer is
        a GPU type at a count), the same offer rents another machine: it stays."""
        if provider.capabilities.machine_identity:
            self.offers.add((offer.provider, offer.id))

    def offers_of(self, provider: str) -> Collection[str]:
        return {o for p, o in self.offers if p == provider}

    def machines_of(self, provider: str) -> Collection[str]:
        return {m for p, m in self.machines if p == provider}


def move_on(lc: Lifecycle, where: Where, trigger: Trigger, reason: str, in_a_row: int) -> None:
    """Ask the policy where to rent after ``trigger`` and make ``lc.plan`` hold that offer
    (another entry's, when it says so); raise what ends the run when it gives up: the
    last search's own paragraph when no entry had an offer."""
    full: NoOffer | None = None
    while True:
        entry = lc.plan.spec.name
        situation = Situation(
            trigger, entry, reason, in_a_row, where.market.names, frozenset(where.without_offer)
        )
        decision = where.policy.decide(situation)
        if decision.move is Move.GIVE_UP:
            if trigger is Trigger.NO_OFFER:
                raise full or NoOffer(reason)
            raise OffersExhausted(decision.reason)
        try:
            if decision.move is Move.WAIT:
                lc.say(f"{decision.reason}; then searching {decision.entry} again")
                if time.time() + decision.wait_s >= lc.plan.deadline_epoch:
                    raise NoOffer(f"{reason} (and max_hours ends before another search)")
                time.sleep(decision.wait_s)  # the policy's wait for offers to come back
                where.without_offer.clear()
                _switch(lc, where, decision.entry, decision.reason, record=False)
            elif decision.move is Move.NEXT_PROVIDER:
                _switch(lc, where, decision.entry, decision.reason, record=True)
            else:
                lc.plan = lc.plan.with_next_offer(
                    lc.provider,
                    where.offers_of(lc.provider.name),
                    where.machines_of(lc.provider.name),
                )
        except NoOffer as err:
            full = err
            where.without_offer.add(decision.entry)
            short = err.short if isinstance(err, NoneUnderCap) else str(err)
            trigger, reason, in_a_row = Trigger.NO_OFFER, short, 1
            continue
        where.without_offer.discard(lc.plan.spec.name)
        return


def _switch(lc: Lifecycle, where: Where, name: str, why: str, record: bool) -> None:
    """Point ``lc`` at entry ``name`` (its provider and its first offer under the cap)."""
    spec = where.market.entry(name)
    provider = where.market.provider(spec)
    before = lc.plan.spec.name
    plan = lc.plan.on_entry(spec, provider)  # raises NoOffer before anything moves
    if before != name:
        lc.move_to(provider, plan, f"moved to {name}: {why}")
        if record:
            where.on_move(before, name, why)
        lc.say(
            f"moving run {plan.run_id} from {before} to {name} ({provider.account.title}): "
            f"{why}; next: {plan.offer.describe()} at ${plan.price:.3f}/h"
        )
    else:
        lc.plan = plan


def rent(lc: Lifecycle, use: Callable[[str], T], where: Where, ledger: Ledger | None = None) -> T:
    """Create an instance for ``lc.plan`` and return ``use(instance_id)``; on a host fault
    or a taken offer, move ``lc.plan`` where the policy says."""
    ledger = ledger or Ledger()
    tried: list[str] = []
    here = 0  # offers tried on this entry: bad hosts and taken offers alike
    any_bad = False
    while True:
        offer = lc.plan.offer
        started = time.monotonic()
        try:
            instance_id = lc.create()
        except OfferTaken as err:
            where.offers.add((offer.provider, offer.id))
            tried.append(f"offer {offer.id}: taken by someone else before the create")
            lc.say(f"offer {offer.id}: {err}")
            here += 1
            trigger, reason = Trigger.OFFER_TAKEN, str(err)
        else:
            try:
                return use(instance_id)
            except HostFault as fault:
                _bad_host(lc, ledger, instance_id, fault)
                where.offers.add((offer.provider, offer.id))
                if offer.machine_id is not None:
                    where.machines.add((offer.provider, offer.machine_id))
                spent = time.monotonic() - started
                tried.append(
                    f"machine {offer.machine_id} (offer {offer.id}, instance {instance_id}): "
                    f"{fault.reason}"
                )
                lc.timings[f"bad host {len(tried)}"] = spent
                here += 1
                any_bad = True
                trigger, reason = Trigger.BAD_HOST, fault.reason
        entry = lc.plan.spec.name
        try:
            move_on(lc, where, trigger, reason, here)
        except OffersExhausted:
            raise _exhausted(lc, tried, not any_bad) from None
        except NoOffer as err:
            raise _exhausted(lc, tried, not any_bad, f" No further offer: {err}") from None
        if lc.plan.spec.name != entry:
            here = 0
            continue
        lc.say(
            f"trying the next offer ({here + 1}/{lc.plan.spec.max_offers}): "
            f"{lc.plan.offer.describe()}{on_machine(lc.plan.offer)} at "
            f"${lc.plan.price:.3f}/h"
        )


def _bad_host(lc: Lifecycle, ledger: Ledger, instance_id: str, fault: HostFault) -> None:
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
            provider=offer.provider,
        )
    )


def _exhausted(lc: Lifecycle, tried: list[str], only_taken: bool, tail: str = "") -> DeployError:
    spec = lc.plan.spec
    listed = "; ".join(tried)
    if only_taken:
        return NoOffer(
            f"every offer tried was taken by someone else before ups could rent it ({listed})."
            f"{tail} Run the deploy again in a minute, or loosen the requirements in "
            "hosts.yaml."
        )
    return OffersExhausted(
        f"{len(tried)} offer(s) tried for run {lc.plan.run_id} and none gave a usable "
        f"instance: {listed}.{tail} Each failed machine was destroyed and is left out of "
        f"searches for ledger_ttl_h ({spec.ledger_ttl_h:g} h; `ups hosts` lists them). Deploy "
        "again to try further offers, raise max_offers in hosts.yaml, or name other entries "
        "under failover."
    )
