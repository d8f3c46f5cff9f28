"""``order: measured``: offers ranked by expected dollars per training sample.

A machine the host ledger measured for this workload is priced by its own ``step``
figure (the latest). An unseen machine is priced by the best figure measured here on a
machine with the same GPU model (and count), scaled by its reliability; where no machine
of its model was measured, by a measured one of another model scaled by the two models'
known-good matmul TFLOP/s. An offer with no estimate at all goes after those, cheapest
first. Without any figure for this workload the search's own order (``dph_total``) stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ups.deploy.managed.ledger import Measurement
from ups.preflight.known_good import bf16_tflops

MEASURED = "measured"
API_ORDER = "dph_total"
"""What the search itself is ordered by under ``order: measured``."""


class Priced(Protocol):
    """What ranking reads of an offer (the Vast rental plan's ``Offer``)."""

    @property
    def machine_id(self) -> int | None: ...
    @property
    def gpu_name(self) -> str: ...
    @property
    def num_gpus(self) -> int: ...
    def price(self, interruptible: bool | float) -> float: ...
    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Ranked:
    row: dict[str, Any]
    offer: Priced
    price: float
    rate: float | None
    """Expected training samples/s of the whole machine; None: no estimate."""
    basis: str

    @property
    def usd_per_msample(self) -> float | None:
        return None if not self.rate else self.price / (self.rate * 3600.0) * 1e6

    def line(self) -> str:
        offer = self.offer
        cost = "$? per M samples" if self.usd_per_msample is None else (
            f"${self.usd_per_msample:.4f} per M samples"
        )  # fmt: skip
        return (
            f"{offer.describe()} on machine {offer.machine_id} at ${self.price:.3f}/h: "
            f"{cost} ({self.basis})"
        )


def _model_tflops(gpu_name: str) -> float | None:
    return bf16_tflops(gpu_name.replace("_", " "))


def rank(
    rows: Sequence[tuple[dict[str, Any], Priced]],
    measured: list[Measurement],
    workload: str,
    interruptible: bool | float,
) -> list[Ranked] | None:
    """``rows`` (each search row with its offer) by expected $ per sample, best first;
    None when nothing of this workload was ever measured (the caller keeps the search's
    order)."""
    mine = [m for m in measured if m.workload == workload and m.samples_per_s]
    if not mine:
        return None
    latest = {m.machine_id: m for m in sorted(mine, key=lambda m: m.at)}
    best: dict[tuple[str, int], Measurement] = {}
    for m in mine:
        key = (m.gpu_name, m.num_gpus)
        if key not in best or (m.samples_per_s or 0) > (best[key].samples_per_s or 0):
            best[key] = m
    ranked = [_estimate(row, offer, latest, best, interruptible) for row, offer in rows]
    return sorted(
        ranked,
        key=lambda r: (r.usd_per_msample is None, r.usd_per_msample or 0.0, r.price),
    )


def _estimate(
    row: dict[str, Any],
    offer: Priced,
    latest: dict[int, Measurement],
    best: dict[tuple[str, int], Measurement],
    interruptible: bool | float,
) -> Ranked:
    price = offer.price(interruptible)
    seen = latest.get(offer.machine_id) if offer.machine_id is not None else None
    if seen is not None and seen.samples_per_s:
        return Ranked(
            row, offer, price, seen.samples_per_s, f"measured {seen.samples_per_s:.3g} /s"
        )
    reliability = float(row.get("reliability") or row.get("reliability2") or 1.0)
    same = best.get((offer.gpu_name, offer.num_gpus))
    if same is not None and same.samples_per_s:
        rate = same.samples_per_s * reliability
        return Ranked(
            row, offer, price, rate,
            f"unseen: best {offer.gpu_name} here {same.samples_per_s:.3g} /s x reliability "
            f"{reliability:.3f}",
        )  # fmt: skip
    mine_tf = _model_tflops(offer.gpu_name)
    for ref in best.values():
        ref_tf = _model_tflops(ref.gpu_name)
        if mine_tf and ref_tf and ref.samples_per_s:
            scale = mine_tf / ref_tf * offer.num_gpus / max(1, ref.num_gpus)
            rate = ref.samples_per_s * scale * reliability
            return Ranked(
                row, offer, price, rate,
                f"unseen: {ref.gpu_name}'s {ref.samples_per_s:.3g} /s x known-good TFLOP/s "
                f"{mine_tf:g}/{ref_tf:g} x reliability {reliability:.3f}",
            )  # fmt: skip
    return Ranked(row, offer, price, None, f"unseen {offer.gpu_name}: no figure to estimate from")
