"""Record what a rented machine's burn-in measured, passed or not, in the host ledger."""

from __future__ import annotations

import time
from collections.abc import Callable

from ups.deploy.managed.ledger import Ledger, Measurement
from ups.deploy.managed.rental_plan import RentalPlan
from ups.preflight.figures import below_floor, figures, workload


def record_figures(
    plan: RentalPlan, report: str, say: Callable[[str], None], ledger: Ledger | None = None
) -> Measurement | None:
    """The burn-in figures of ``report`` (the remote preflight table) as a ledger entry for
    ``plan``'s machine; None when the report has none (burn-in off) or no machine is known."""
    found = figures(report)
    offer = plan.offer
    if not found or offer.machine_id is None or plan.cfg is None:
        return None
    entry = Measurement(
        machine_id=offer.machine_id,
        gpu_name=offer.gpu_name,
        num_gpus=offer.num_gpus,
        figures={name: row.value for name, row in found.items()},
        dph=plan.price,
        workload=workload(plan.cfg),
        at=time.time(),
        run_id=plan.run_id,
        host=plan.spec.name,
        passed=not below_floor(report),
        offer_id=offer.id,
        known_good={name: row.known for name, row in found.items() if row.known is not None},
        provider=offer.provider,
    )
    (ledger or Ledger()).measured(entry)
    per_m = entry.usd_per_msample()
    cost = f", ${per_m:.4f} per million samples at ${entry.dph:.3f}/h" if per_m else ""
    shown = ", ".join(f"{k} {v:.3g}" for k, v in entry.figures.items())
    say(f"machine {offer.machine_id}: burn-in {shown}{cost}; recorded in the host ledger")
    return entry
