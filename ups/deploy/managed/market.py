"""The rented entries one run may rent from, in order, each with its provider opened once
through the registry: what the controller lists a run's instances across and what a move
to another provider switches to."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ups.deploy import providers
from ups.deploy.entries import RentedHost
from ups.deploy.providers import Instance, Provider


class Market:
    """The run's entries (its first, then its ``failover`` ones), their providers opened
    on first use."""

    def __init__(
        self,
        entries: Sequence[RentedHost],
        open_provider: Callable[[RentedHost], Provider] = providers.open_provider,
    ) -> None:
        assert entries, "a managed run rents from at least one entry"
        self.entries = tuple(entries)
        self._open = open_provider
        self._opened: dict[str, Provider] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.entries)

    def entry(self, name: str) -> RentedHost:
        return next(spec for spec in self.entries if spec.name == name)

    def provider(self, spec: RentedHost) -> Provider:
        """The provider of entry ``spec`` (opened once)."""
        if spec.name not in self._opened:
            self._opened[spec.name] = self._open(spec)
        return self._opened[spec.name]

    def accounts(self) -> list[Provider]:
        """One provider per account the run may rent on (two entries of one provider and
        one API are one account: its instances are listed once)."""
        seen: dict[tuple[str, str | None], Provider] = {}
        for spec in self.entries:
            key = (spec.kind, providers.package(spec.kind).watchdog_endpoint(spec))
            seen.setdefault(key, self.provider(spec))
        return list(seen.values())

    def instances(self, run_id: str) -> list[tuple[Provider, Instance]]:
        """Every instance labelled for ``run_id`` on every account, with its provider."""
        return [(p, inst) for p in self.accounts() for inst in p.list(run_id)]
