"""Where a run goes when an offer, a host or an instance fails it: the recovery policies
(:class:`~ups.deploy.providers.base.RecoveryPolicy`), one named object per strategy, as
SkyPilot's ``recovery_strategy``.

- :class:`NextOffer` stays with the entry's provider: the next matching offer after a bad
  host, a taken offer or a lost instance, up to ``max_offers`` bad hosts; no offer under
  the cap ends the run (exit 6).
- :class:`Failover` does the same, and moves the run to the next rented entry in the order
  the user listed (``failover:`` in hosts.yaml) when its provider has no offer under the
  cap or ``max_offers`` hosts failed in a row; the run resumes there from its newest
  checkpoint, preflight-gated like any new instance.
- :class:`WaitAndRetry` wraps either: where it would give up for want of an offer, it waits
  ``wait_s`` and searches the first entry again (bounded by ``max_hours``).

:func:`policy_for` picks one from the run's entries; a caller may pass its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ups.deploy.entries import RentedHost
from ups.deploy.providers import Decision, Move, RecoveryPolicy, Situation, Trigger


def _limit(limits: Mapping[str, int], entry: str) -> int:
    return limits.get(entry, 3)


@dataclass
class NextOffer:
    """The next offer on the same provider, never another provider."""

    max_offers: Mapping[str, int] = field(default_factory=dict)
    """Per entry: bad hosts (or taken offers) in a row before giving up."""
    name: str = "next_offer"

    def decide(self, situation: Situation) -> Decision:
        s = situation
        if s.trigger is Trigger.NO_OFFER:
            return Decision(Move.GIVE_UP, s.entry, s.reason)
        if s.trigger is not Trigger.LOST and s.in_a_row >= _limit(self.max_offers, s.entry):
            return Decision(Move.GIVE_UP, s.entry, f"{s.in_a_row} offer(s) tried: {s.reason}")
        return Decision(Move.NEXT_OFFER, s.entry, s.reason)


@dataclass
class Failover:
    """The next offer on the same provider; the next entry (provider) when this one has no
    offer under the cap or ``max_offers`` of its hosts failed in a row."""

    max_offers: Mapping[str, int] = field(default_factory=dict)
    name: str = "failover"

    def decide(self, situation: Situation) -> Decision:
        s = situation
        exhausted = s.trigger is Trigger.BAD_HOST and s.in_a_row >= _limit(self.max_offers, s.entry)
        if s.trigger is Trigger.NO_OFFER or exhausted:
            why = (
                f"no offer under the cap on {s.entry}"
                if s.trigger is Trigger.NO_OFFER
                else f"{s.in_a_row} bad host(s) in a row on {s.entry}"
            )
            following = _after(s.entries, s.entry, s.without_offer)
            if following is None:
                return Decision(Move.GIVE_UP, s.entry, f"{why}, and no other entry has one")
            return Decision(Move.NEXT_PROVIDER, following, f"{why}: {s.reason}")
        if s.trigger is Trigger.OFFER_TAKEN and s.in_a_row >= _limit(self.max_offers, s.entry):
            return Decision(Move.GIVE_UP, s.entry, f"{s.in_a_row} offer(s) taken: {s.reason}")
        return Decision(Move.NEXT_OFFER, s.entry, s.reason)


def _after(entries: tuple[str, ...], entry: str, without: frozenset[str]) -> str | None:
    """The first entry after ``entry`` (in order, wrapping round) not known to have no offer."""
    if entry not in entries:
        return next((e for e in entries if e not in without), None)
    i = entries.index(entry)
    for other in entries[i + 1 :] + entries[:i]:
        if other not in without and other != entry:
            return other
    return None


@dataclass
class WaitAndRetry:
    """``inner``'s decisions, except that wanting an offer waits ``wait_s`` and searches the
    first entry again instead of giving up."""

    inner: RecoveryPolicy
    wait_s: float
    name: str = "wait_and_retry"

    def decide(self, situation: Situation) -> Decision:
        decision = self.inner.decide(situation)
        if decision.move is Move.GIVE_UP and situation.trigger is Trigger.NO_OFFER:
            first = situation.entries[0] if situation.entries else situation.entry
            return Decision(
                Move.WAIT, first, f"{decision.reason}; waiting {self.wait_s:g} s", self.wait_s
            )
        return decision


def policy_for(entries: tuple[RentedHost, ...]) -> RecoveryPolicy:
    """The policy a run's entries ask for: :class:`Failover` when the first lists others
    (``failover:``), else :class:`NextOffer`; either waits for offers when the first says
    ``no_offer_wait_s``."""
    limits = {spec.name: spec.max_offers for spec in entries}
    base: RecoveryPolicy = Failover(limits) if len(entries) > 1 else NextOffer(limits)
    wait_s = entries[0].no_offer_wait_s if entries else 0.0
    return WaitAndRetry(base, wait_s) if wait_s > 0 else base
