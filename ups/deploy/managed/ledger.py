"""The host ledger: Vast machines that failed a deploy here, so later deploys skip them.

Offer order is deterministic: without a memory of bad machines, the next deploy searches
the same query in the same order and rents the same broken machine again. Each host
fault (:mod:`ups.deploy.managed.faults`) adds one entry: the machine, its host, the offer and
instance, what failed and when. A deploy or recovery excludes every machine with an entry
younger than ``ledger_ttl_h`` from its offer search. The file is strict JSON at
``<state dir>/hosts-ledger.json`` (:func:`ups.statedir.state_dir`), replaced atomically
under a lock so two deploys never lose each other's entries; ``ups hosts`` shows it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ups import jsonio
from ups.deploy.errors import DeployError
from ups.fsio import atomic_write_text
from ups.statedir import state_dir

LEDGER_NAME = "hosts-ledger.json"
KEEP_DAYS = 30.0
"""Entries older than this are dropped when the ledger is next written."""


@dataclass(frozen=True, slots=True)
class Failure:
    machine_id: int
    host_id: int | None
    offer_id: int
    instance_id: int | None
    failure: str
    """What failed, in a few words (the status message, the failing step)."""
    at: float
    """When, in seconds since the epoch (UTC)."""
    run_id: str
    host: str
    """The hosts.yaml entry that rented it."""

    def describe(self) -> str:
        return f"machine {self.machine_id} (offer {self.offer_id}): {self.failure}"


def ledger_path() -> Path:
    return state_dir() / LEDGER_NAME


class Ledger:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or ledger_path()

    def read(self) -> list[Failure]:
        """Every entry, oldest first; a missing file is an empty ledger."""
        try:
            raw = json.loads(self.path.read_text())
            return [Failure(**entry) for entry in raw.get("failures", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise DeployError(
                f"the host ledger {self.path} cannot be read ({err}). Move it aside (ups "
                "starts a new one) or fix it by hand; it only lists machines to avoid."
            ) from None

    def record(self, failure: Failure) -> None:
        with self._locked():
            horizon = time.time() - KEEP_DAYS * 86400.0
            kept = [f for f in self.read() if f.at >= horizon]
            body = {"failures": [asdict(f) for f in [*kept, failure]]}
            atomic_write_text(self.path, jsonio.dumps(body, indent=2) + "\n")

    def recent(self, ttl_h: float, now: float | None = None) -> list[Failure]:
        """Entries younger than ``ttl_h`` hours."""
        horizon = (time.time() if now is None else now) - ttl_h * 3600.0
        return [f for f in self.read() if f.at >= horizon]

    def excluded(self, ttl_h: float, now: float | None = None) -> set[int]:
        """Machine ids to leave out of an offer search."""
        return {f.machine_id for f in self.recent(ttl_h, now)}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.with_name(self.path.name + ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def render(failures: list[Failure], ttl_h: float, now: float | None = None) -> str:
    """The ledger as a table for people (``ups hosts``, ``fab instances --ledger``)."""
    now = time.time() if now is None else now
    if not failures:
        return "the host ledger is empty: no Vast machine has failed a deploy here"
    header = f"{'machine':>9} {'host':>8} {'offer':>9} {'instance':>9}  {'age':>7}  skip  failure"
    lines = [header]
    for f in sorted(failures, key=lambda f: f.at, reverse=True):
        age_h = (now - f.at) / 3600.0
        skip = "yes" if age_h < ttl_h else "no"
        lines.append(
            f"{f.machine_id:>9} {f.host_id if f.host_id is not None else '-':>8} "
            f"{f.offer_id:>9} {f.instance_id or '-':>9}  {age_h:>6.1f}h  {skip:<4}  "
            f"{f.failure} (run {f.run_id})"
        )
    lines.append(
        f"{len(failures)} failure(s); machines marked 'skip' failed within ledger_ttl_h "
        f"({ttl_h:g} h) and are left out of offer searches"
    )
    return "\n".join(lines)
