"""``order: measured``: offers ranked by expected dollars per training sample.

A machine the host ledger measured for this workload is priced by its own ``step``
figure (the latest). An unseen machine is priced by the best figure measured here on a
machine with the same GPU model (and count), scaled by its reliability; where no machine
of its model was measured, by a measured one of another model scaled by the two models'
known-good matmul TFLOP/s. An offer with no estimate at all goes after those, cheapest
first. Without any figure for this workload the search's own order (cheapest first) stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ups.deploy.managed.ledger import Measurement
from ups.deploy.providers import Offer, gpu_key
from ups.preflight.known_good import bf16_tflops


@dataclass(frozen=True, slots=True)
class Ranked:
    offer: Offer
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
            f"{offer.describe()}{on_machine(offer)} at ${self.price:.3f}/h: {cost} ({self.basis})"
        )


def on_machine(offer: Offer) -> str:
    """`` on machine M`` where the provider names the machine, else nothing."""
    return "" if offer.machine_id is None else f" on machine {offer.machine_id}"


def _model_tflops(gpu_name: str) -> float | None:
    return bf16_tflops(gpu_name.replace("_", " "))


def rank(
    offers: Sequence[Offer],
    measured: list[Measurement],
    workload: str,
    interruptible: bool | float,
) -> list[Ranked] | None:
    """``offers`` by expected $ per sample, best first; None when nothing of this workload
    was ever measured (the caller keeps the search's order). A machine's own figure counts
    only for offers of the provider that measured it; a GPU model's figure, for all."""
    mine = [m for m in measured if m.workload == workload and m.samples_per_s]
    if not mine:
        return None
    latest = {(m.provider, m.machine_id): m for m in sorted(mine, key=lambda m: m.at)}
    best: dict[tuple[str, int], Measurement] = {}
    for m in mine:
        key = (gpu_key(m.gpu_name), m.num_gpus)
        if key not in best or (m.samples_per_s or 0) > (best[key].samples_per_s or 0):
            best[key] = m
    ranked = [_estimate(offer, latest, best, interruptible) for offer in offers]
    return sorted(
        ranked,
        key=lambda r: (r.usd_per_msample is None, r.usd_per_msample or 0.0, r.price),
    )


def _estimate(
    offer: Offer,
    latest: dict[tuple[str, str], Measurement],
    best: dict[tuple[str, int], Measurement],
    interruptible: bool | float,
) -> Ranked:
    price = offer.price(interruptible)
    mid = offer.machine_id
    seen = latest.get((offer.provider, mid)) if mid is not None else None
    if seen is not None and seen.samples_per_s:
        return Ranked(offer, price, seen.samples_per_s, f"measured {seen.samples_per_s:.3g} /s")
    reliability = offer.reliability or 1.0
    same = best.get((gpu_key(offer.gpu_name), offer.num_gpus))
    if same is not None and same.samples_per_s:
        rate = same.samples_per_s * reliability
        return Ranked(
            offer, price, rate,
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
                offer, price, rate,
                f"unseen: {ref.gpu_name}'s {ref.samples_per_s:.3g} /s x known-good TFLOP/s "
                f"{mine_tf:g}/{ref_tf:g} x reliability {reliability:.3f}",
            )  # fmt: skip
    return Ranked(offer, price, None, f"unseen {offer.gpu_name}: no figure to estimate from")
