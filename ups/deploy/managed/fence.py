"""The fence without a check-then-act window: a supervisor ends the instances of its run
that a supervisor of an older lease epoch created.

A provider's API cannot refuse a stale caller: a supervisor frozen between passing its
lease check and sending a create (a laptop that slept, a stopped process) creates an
instance after it wakes, though another supervisor holds the run by then. Every instance
carries the epoch of the supervisor that created it in its label
(:class:`~ups.deploy.providers.base.RunLabel`), so the holder of a newer epoch lists the
run's instances on every provider every ``monitor_s`` and ends each one that is loading or
running, older than its epoch, and neither created nor adopted by it; the run record
keeps it, with its cost and why. Instances no supervisor reaches at all end themselves:
their watchdog's ``start_timeout_s`` (:mod:`ups.deploy.providers.watchdog`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from ups.deploy.errors import DeployError
from ups.deploy.managed.lease import LeaseLost
from ups.deploy.managed.market import Market
from ups.deploy.providers import Instance, InstanceState, Provider

BILLING = (InstanceState.LOADING, InstanceState.RUNNING)
"""What the fence ends: an instance that computes (a stopped one bills its disk only, and
may be one a person keeps per on_exit)."""


def strays(
    found: list[tuple[Provider, Instance]], epoch: int, mine: Collection[tuple[str, str]]
) -> list[tuple[Provider, Instance, str]]:
    """The instances among ``found`` the holder of ``epoch`` must end, each with why."""
    ended = []
    for provider, inst in found:
        run = inst.run
        if run is None or not run.older_than(epoch) or inst.state not in BILLING:
            continue
        if (provider.name, inst.id) in mine:
            continue
        made = "no epoch (an older release)" if run.epoch is None else f"epoch {run.epoch}"
        ended.append(
            (
                provider,
                inst,
                f"created under lease {made}, older than this supervisor's {epoch}, and "
                "neither created nor adopted by it (a supervisor that lost the run)",
            )
        )
    return ended


class Sweeper:
    """A thread that ends the run's stray instances every ``every_s`` (the fence's bound)."""

    def __init__(
        self,
        market: Market,
        run_id: str,
        epoch: int,
        *,
        mine: Callable[[], Collection[tuple[str, str]]],
        end: Callable[[Provider, Instance, str], None],
        every_s: float,
    ) -> None:
        self.market = market
        self.run_id = run_id
        self.epoch = epoch
        self.mine = mine
        self.end = end
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fence-sweep")

    def sweep(self) -> int:
        """One look at every account: end the strays; how many were ended."""
        found = self.market.instances(self.run_id)
        ended = strays(found, self.epoch, self.mine())
        for provider, inst, why in ended:
            self.end(provider, inst, why)
        return len(ended)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep()
            except LeaseLost:
                return  # the run is another supervisor's now: its sweeps are its own
            except DeployError:
                continue  # an API outage: the next sweep tries again

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)
