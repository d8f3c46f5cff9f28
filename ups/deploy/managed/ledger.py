"""The host ledger: rented machines that failed a deploy here, so later deploys skip them, and
every machine's burn-in figures, so later deploys rank offers by what they deliver.

Offer order is deterministic: without a memory of bad machines, the next deploy searches
the same query in the same order and rents the same broken machine again. Each host
fault (:mod:`ups.deploy.managed.faults`) adds one entry: the machine, its host, the offer and
instance, what failed and when. A deploy or recovery excludes every machine with an entry
younger than ``ledger_ttl_h`` from its offer search. The file is strict JSON at
``<state dir>/hosts-ledger.json`` (:func:`ups.statedir.state_dir`), replaced atomically
under a lock so two deploys never lose each other's entries; ``ups hosts`` shows it.

Each machine a burn-in measured (docs/burn-in.md) adds a :class:`Measurement`, whether it
passed or not: its GPU, figures, price and the workload its ``step`` figure is of.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ups import jsonio
from ups.deploy.errors import DeployError
from ups.deploy.providers import UNNAMED
from ups.fsio import atomic_write_text
from ups.statedir import state_dir

LEDGER_NAME = "hosts-ledger.json"
KEEP_DAYS = 30.0
"""Entries older than this are dropped when the ledger is next written."""


def _ids(entry: dict[str, Any], *keys: str) -> dict[str, Any]:
    """An entry with its ids as strings (the previous release wrote them as numbers)."""
    return {k: (str(v) if k in keys and v is not None else v) for k, v in entry.items()}


@dataclass(frozen=True, slots=True)
class Failure:
    machine_id: str
    host_id: str | None
    offer_id: str
    instance_id: str | None
    failure: str
    """What failed, in a few words (the status message, the failing step)."""
    at: float
    """When, in seconds since the epoch (UTC)."""
    run_id: str
    host: str
    """The hosts.yaml entry that rented it."""
    provider: str = UNNAMED
    """Whose machine ids these are (:data:`~ups.deploy.providers.UNNAMED` for the previous
    release's entries)."""

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Failure:
        return cls(**_ids(entry, "machine_id", "host_id", "offer_id", "instance_id"))

    def describe(self) -> str:
        return f"machine {self.machine_id} (offer {self.offer_id}): {self.failure}"


@dataclass(frozen=True, slots=True)
class Measurement:
    machine_id: str
    gpu_name: str
    num_gpus: int
    figures: dict[str, float]
    """``{figure: value}`` as the burn-in rows showed them (ups.preflight.figures)."""
    dph: float
    """What the machine cost per hour when measured."""
    workload: str
    """The run config's workload digest: ``step`` figures compare only within one."""
    at: float
    run_id: str
    host: str
    passed: bool
    """False when a figure was below its floor (the machine is then also a failure)."""
    offer_id: str | None = None
    known_good: dict[str, float] = field(default_factory=dict)
    provider: str = UNNAMED

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Measurement:
        return cls(**_ids(entry, "machine_id", "offer_id"))

    @property
    def samples_per_s(self) -> float | None:
        """The machine's training samples/s: one process's step figure times its GPUs."""
        step = self.figures.get("step")
        return None if step is None else step * max(1, self.num_gpus)

    def usd_per_msample(self) -> float | None:
        rate = self.samples_per_s
        return None if not rate else self.dph / (rate * 3600.0) * 1e6


def ledger_path() -> Path:
    return state_dir() / LEDGER_NAME


class Ledger:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or ledger_path()

    def read(self) -> list[Failure]:
        """Every failure, oldest first; a missing file is an empty ledger."""
        return [Failure.from_json(entry) for entry in self._raw().get("failures", [])]

    def measurements(self) -> list[Measurement]:
        """Every machine measured, oldest first."""
        return [Measurement.from_json(entry) for entry in self._raw().get("measured", [])]

    def _raw(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text())
            # Built here so a malformed entry is reported like a malformed file.
            [Failure.from_json(e) for e in raw.get("failures", [])]
            [Measurement.from_json(e) for e in raw.get("measured", [])]
            return dict(raw)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise DeployError(
                f"the host ledger {self.path} cannot be read ({err}). Move it aside (ups "
                "starts a new one) or fix it by hand; it only lists machines to avoid."
            ) from None

    def record(self, failure: Failure) -> None:
        self._add("failures", asdict(failure))

    def measured(self, measurement: Measurement) -> None:
        self._add("measured", asdict(measurement))

    def _add(self, key: str, entry: dict[str, Any]) -> None:
        with self._locked():
            horizon = time.time() - KEEP_DAYS * 86400.0
            raw = self._raw()
            body = {
                k: [e for e in raw.get(k, []) if e["at"] >= horizon]
                for k in ("failures", "measured")
            }
            body[key].append(entry)
            atomic_write_text(self.path, jsonio.dumps(body, indent=2) + "\n")

    def recent(self, ttl_h: float, now: float | None = None) -> list[Failure]:
        """Entries younger than ``ttl_h`` hours."""
        horizon = (time.time() if now is None else now) - ttl_h * 3600.0
        return [f for f in self.read() if f.at >= horizon]

    def excluded(self, ttl_h: float, provider: str, now: float | None = None) -> set[str]:
        """Machine ids of ``provider`` to leave out of an offer search."""
        return {f.machine_id for f in self.recent(ttl_h, now) if f.provider == provider}

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
        return "the host ledger is empty: no rented machine has failed a deploy here"
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


def render_measured(measured: list[Measurement]) -> str:
    """Every machine measured, latest first: what it delivered and what a sample cost."""
    if not measured:
        return "no machine measured yet (a rented host's burn-in adds one: docs/burn-in.md)"
    header = (
        f"{'machine':>9}  {'GPU':<16} {'matmul vs known-good':<24} {'busbw':>9} "
        f"{'step/s':>9} {'$/h':>7} {'$/M samples':>11}  {'ok':<4} when (UTC)"
    )
    lines = [header]
    for m in sorted(measured, key=lambda m: m.at, reverse=True):
        f, k = m.figures, m.known_good
        mm = "-" if "matmul" not in f else f"{f['matmul']:.3g}"
        if "matmul" in k:
            mm += f" vs {k['matmul']:.3g} ({f['matmul'] / k['matmul']:.2f})"
        busbw = "-" if "busbw" not in f else f"{f['busbw']:.3g}"
        step = "-" if "step" not in f else f"{f['step']:.3g}"
        per_m = m.usd_per_msample()
        cost = "-" if per_m is None else f"{per_m:.4f}"
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(m.at))
        gpu = f"{m.num_gpus}x {m.gpu_name}"
        lines.append(
            f"{m.machine_id:>9}  {gpu:<16} {mm:<24} {busbw:>9} {step:>9} {m.dph:>7.3f} "
            f"{cost:>11}  {'yes' if m.passed else 'no':<4} {when}"
        )
    lines.append(
        f"{len(measured)} measurement(s); step/s is one process's training samples/s of the "
        "run's model (x GPUs for the machine); $/M samples = $/h over the machine's samples/h"
    )
    return "\n".join(lines)
